package fidelity

import (
	"bytes"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// vLLM's audio routes (/v1/audio/transcriptions, /translations) take a
// multipart form: the audio file, the model and the other fields. The
// gateway read every POST body as JSON and answered such a request with
// its own 400; it now routes it by load to a worker of the form's model,
// the body as it came, and a JSON request to any route the prediction
// counters do not read (vLLM's usage there is not the completions') is
// routed without being counted.
func TestAudioFormsReachTheWorker(t *testing.T) {
	var got struct {
		model, file string
		parts       int
	}
	worker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/audio/transcriptions" {
			http.NotFound(w, r)
			return
		}
		if err := r.ParseMultipartForm(1 << 20); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		got.model, got.parts = r.FormValue("model"), len(r.MultipartForm.Value)+len(r.MultipartForm.File)
		if f, _, err := r.FormFile("file"); err == nil {
			b, _ := io.ReadAll(f)
			got.file = string(b)
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"text":"hello"}`))
	}))
	defer worker.Close()
	g := startGatewayWith(t, "use_kv_events off\n\t\tengine_facts off")
	g.register(t, map[string]any{"worker_id": 7, "endpoint": worker.Listener.Addr().String(), "model_name": "whisper"})
	g.waitSchedulable(t, 1)

	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	fw, _ := mw.CreateFormFile("file", "a.wav")
	_, _ = fw.Write([]byte("RIFF....WAVE audio bytes"))
	_ = mw.WriteField("model", "whisper")
	_ = mw.WriteField("language", "en")
	_ = mw.Close()
	req, _ := http.NewRequest(http.MethodPost, g.proxy+"/v1/audio/transcriptions", &body)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	answer, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !strings.Contains(string(answer), "hello") {
		t.Fatalf("the form through the gateway: %d %s", res.StatusCode, answer)
	}
	if got.model != "whisper" || got.file != "RIFF....WAVE audio bytes" || got.parts != 3 {
		t.Fatalf("the worker got model %q, file %q, %d parts", got.model, got.file, got.parts)
	}
	if worker := res.Header.Get("X-KVRouter-Worker"); worker != "7" {
		t.Fatalf("routed to worker %q, want 7", worker)
	}
	if p := g.predictions(t, "whisper"); p.Requests != 0 {
		t.Fatalf("the audio answer was counted as a prediction: %+v", p)
	}
}
