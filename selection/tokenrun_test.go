package selection

import (
	stdjson "encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestTokenRunAgainstEncodingJSON drives the 64-byte separator-mask path
// with long compact arrays, each with at most one odd element or separator
// at a random index (so it lands before, across and after chunk borders),
// and checks the decoder agrees with encoding/json on accepting the body
// (null elements are left out: encoding/json reads them as 0, serde and we
// refuse them)
// and on every token id.
func TestTokenRunAgainstEncodingJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 15))
	odd := []string{
		"0", "00", "01", "-1", "1.0", "1e3", " 7", "7 ", "4294967295", "4294967296",
		"123456789", "12345678", "99999999", "100000000", `"1"`, "[1]", "",
	}
	for iter := range 4000 {
		n := 1 + rng.IntN(300)
		elems := make([]string, n)
		for i := range elems {
			elems[i] = strconv.Itoa(rng.IntN([]int{10, 1000, 150000, 100000000}[rng.IntN(4)]))
		}
		if rng.IntN(3) > 0 {
			elems[rng.IntN(n)] = odd[rng.IntN(len(odd))]
		}
		body := `{"model_name":"m` + strings.Repeat("x", rng.IntN(70)) + `","token_ids":[` +
			strings.Join(elems, ",") + `],"routing_group":"g,1,2,3,"}`
		agreesWithStdJSON(t, body, fmt.Sprintf("iter %d: %q", iter, body))
	}
}

// TestCommaBits checks wordMasks's byte-to-bit gather on every
// single-comma and a few mixed words.
func TestCommaBits(t *testing.T) {
	commas := func(x uint64) uint64 { m, _, _ := wordMasks(x); return m }
	for j := range 8 {
		w := []byte("12345678")
		w[j] = ','
		x := uint64(0)
		for k := 7; k >= 0; k-- {
			x = x<<8 | uint64(w[k])
		}
		if got := commas(x); got != 1<<j {
			t.Fatalf("comma at %d: mask %08b", j, got)
		}
	}
	// Bytes next to a comma, and 0x2C±1 and 0xAC, are not commas.
	w := []byte{',', '+', '-', ',', 0xAC, 0x2C, 0x00, 0xFF}
	x := uint64(0)
	for k := 7; k >= 0; k-- {
		x = x<<8 | uint64(w[k])
	}
	if got := commas(x); got != 0b00101001 {
		t.Fatalf("mixed word: mask %08b", got)
	}
}

// TestTokenRunBlockBorders puts one odd element (a letter, a space, a
// leading zero, an empty or a nine-digit element) at every index of an
// array written compact and with Python's ", " separators, under every
// alignment of the array to the 64-byte blocks, so the odd bytes land
// first, last and across the border of a block the unchecked path would
// otherwise take; the decoder must agree with encoding/json on accepting
// the body and on every token id.
func TestTokenRunBlockBorders(t *testing.T) {
	odd := []string{"1x3", "12 ", " 12", "1 2", "0123", "", "123456789", "7-1", "1.5", "1e3", `"7"`, "99999999", "0", "\t5", "5\n"}
	elems := make([]string, 60)
	for i := range elems {
		elems[i] = strconv.Itoa(1000 + 7919*i%9000000) // four to seven digits
	}
	for _, sep := range []string{",", ", "} {
		for pad := range 64 {
			for at := range 40 {
				for _, o := range odd {
					e := slices.Clone(elems)
					e[at] = o
					body := `{"model_name":"` + strings.Repeat("m", pad) + `","token_ids":[` + strings.Join(e, sep) + `]}`
					agreesWithStdJSON(t, body, fmt.Sprintf("sep %q, pad %d, %q at %d", sep, pad, o, at))
				}
			}
		}
	}
}

// agreesWithStdJSON checks that DecodeJSON accepts body exactly when
// encoding/json does, and then reads the same token ids; what names the
// case in a failure.
func agreesWithStdJSON(t *testing.T, body, what string) {
	t.Helper()
	var want struct {
		TokenIDs []uint32 `json:"token_ids"`
	}
	werr := stdjson.Unmarshal([]byte(body), &want)
	var got SelectRequest
	gerr := DecodeJSON([]byte(body), &got)
	if (werr == nil) != (gerr == nil) {
		t.Fatalf("%s: encoding/json says %v, we say %v", what, werr, gerr)
	}
	if gerr == nil && !slices.Equal(got.TokenIDs, want.TokenIDs) {
		t.Fatalf("%s: got %v, want %v", what, got.TokenIDs, want.TokenIDs)
	}
}
