package api_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/kvrouter/caddy-kvrouter/selection"
	"github.com/kvrouter/caddy-kvrouter/selection/api"
)

// The HTTP mode: the same router behind Dynamo's routes. A client
// registers workers, then asks where a prompt should go.
func ExampleNewHandler() {
	cfg := selection.DefaultConfig()
	cfg.UseKVEvents = false // learn prefixes from bookings
	r, err := selection.NewRouter(cfg)
	if err != nil {
		panic(err)
	}
	defer r.Close()
	// No write token: catalog writes are accepted from loopback clients,
	// which the test server's are.
	srv := httptest.NewServer(api.NewHandler(r, 0))
	defer srv.Close()

	post := func(path, body string) string {
		resp, err := http.Post(srv.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			panic(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return fmt.Sprintf("%d %s", resp.StatusCode, b)
	}
	post("/workers", `{"worker_id":1,"endpoint":"10.0.0.1:8000","block_size":4}`)
	fmt.Println(post("/select", `{"token_ids":[1,2,3,4,5]}`)[:3])
	fmt.Println(post("/select", `{"token_ids":[1,-2]}`))
	// Output:
	// 200
	// 422 {"error":"Failed to deserialize the JSON body into the target type: token_ids[1]: invalid value: integer `-2`, expected u32 at line 1 column 17"}
}
