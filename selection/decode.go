package selection

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"sync"

	json "github.com/goccy/go-json"
)

// Decoding of request bodies. The prompt's token_ids can be 100k elements; it
// is parsed here in one pass straight into a []uint32 (tokenarray.go), and
// everything else in the body (a few small members) goes to goccy/go-json. A
// body without token_ids goes to goccy as it is; a body with it goes as a copy
// of its other members, so goccy never walks the token array.

// promptCarrier is a request type that embeds Prompt or TokenPrompt: it
// says where token_ids go.
type promptCarrier interface{ tokenIDs() *[]uint32 }

// Text prefixes of axum's JSON extractor rejections, which Dynamo's clients
// see (docs/selection-api.md, "Errors").
const (
	syntaxPrefix = "Failed to parse the request body as JSON: "
	shapePrefix  = "Failed to deserialize the JSON body into the target type: "
)

// ShapeError is a 422 with axum's text for well-formed JSON of the wrong
// shape, for the checks a caller makes after DecodeJSON (a missing field).
func ShapeError(msg string) *Error { return &Error{Kind: KindUnprocessable, Msg: shapePrefix + msg} }

var remainderPool = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// PromptTokenCarrier is implemented by request types that also take an
// integer-array "prompt" (OpenAI's completions) through the fast token
// decoder. PromptTokens returns where to put them; its current capacity is
// reused. A "prompt" that is not an integer array (text, a batch) is left
// to the generic decoder.
type PromptTokenCarrier interface {
	PromptTokens() *[]uint32
}

// InputIDsCarrier is implemented by request types that also take SGLang's
// "input_ids" (its /generate's token prompt) through the fast token
// decoder, as PromptTokenCarrier does for "prompt".
type InputIDsCarrier interface {
	InputIDs() *[]uint32
}

// DecodeJSON decodes a request body into v (a *SelectRequest,
// *ReservationRequest, *ScoreRequest or any type embedding Prompt or
// TokenPrompt). The token
// slice already in v is reused when it has room, so a caller that pools its
// request values decodes without allocating per token. Errors are *Error of
// kind KindMalformed (400) or KindUnprocessable (422) with axum's texts.
func DecodeJSON(body []byte, v promptCarrier) error {
	ids := v.tokenIDs()
	st := decodeState{tokens: (*ids)[:0]}
	*ids = nil
	if ptc, ok := v.(PromptTokenCarrier); ok {
		st.arrays[0] = tokenMember{name: "prompt", dst: ptc.PromptTokens()}
	}
	if ic, ok := v.(InputIDsCarrier); ok {
		st.arrays[1] = tokenMember{name: "input_ids", dst: ic.InputIDs()}
	}
	for i := range st.arrays {
		if a := &st.arrays[i]; a.dst != nil {
			*a.dst = (*a.dst)[:0]
		}
	}
	if _, ok := v.(ExactNames); ok {
		st.exact = namesOf(v)
	}
	sc := scanner{b: body}
	sc.ws()
	if sc.i >= len(body) || body[sc.i] != '{' {
		// Not an object: let goccy classify it (syntax error or wrong type).
		return goccyDecode(body, v)
	}
	if err := st.scanObject(&sc); err != nil {
		return err
	}
	if err := st.decodeRest(body, v); err != nil {
		return err
	}
	if st.tokensFound {
		*ids = st.tokens
	}
	for i := range st.arrays {
		if a := &st.arrays[i]; a.dst != nil && !a.found {
			*a.dst = nil // no integer array: not a reused buffer's leftovers
		}
	}
	return nil
}

// tokenMember is a member besides token_ids that the fast token decoder
// reads when it is an integer array: "prompt" (PromptTokenCarrier) or
// "input_ids" (InputIDsCarrier).
type tokenMember struct {
	name  string
	dst   *[]uint32 // where its tokens go; nil when v takes none
	found bool      // an integer array was read into dst
}

// arrayFor is the token member named key, or nil.
func (st *decodeState) arrayFor(key []byte) *tokenMember {
	for i := range st.arrays {
		if a := &st.arrays[i]; a.dst != nil && string(key) == a.name {
			return a
		}
	}
	return nil
}

// decodeState is what DecodeJSON's pass over the top-level object has
// found: the token arrays parsed in place, and where they were, so that
// goccy gets the body without them.
type decodeState struct {
	tokens      []uint32 // token_ids, into the caller's reused buffer
	seenTokens  bool     // a token_ids member was read: another is a duplicate
	tokensFound bool     // and it was not null
	// arrays are the other members read as token arrays when they are
	// integer arrays: "prompt", then "input_ids".
	arrays [2]tokenMember
	// exact is v's member names when v matches them exactly (ExactNames);
	// nil when names match with case folded.
	exact *memberNames
	// cuts are the members goccy does not get (parsed here, or left out
	// under exact names), in body order: the usual one or two in place,
	// more (left out under exact names only) in extra.
	cuts  [2]span
	ncut  int
	extra []span
}

// span is a member's byte range [start, end) in the body.
type span struct{ start, end int }

// scanObject reads the top-level object from its opening brace to the end
// of the body: it parses token_ids (and an integer-array prompt) in place
// and checks the syntax of every other member, which it skips.
func (st *decodeState) scanObject(sc *scanner) error {
	body := sc.b
	sc.i++ // the opening brace
	sc.ws()
	if sc.i < len(body) && body[sc.i] == '}' {
		sc.i++
		return sc.end()
	}
	for {
		sc.ws()
		if sc.i >= len(body) {
			return sc.syntax("EOF while parsing an object")
		}
		keyStart := sc.i
		key, err := sc.key()
		if err != nil {
			return err
		}
		sc.ws()
		if sc.i >= len(body) || body[sc.i] != ':' {
			return sc.syntax("expected `:`")
		}
		sc.i++
		sc.ws()
		if err := st.member(sc, key, keyStart); err != nil {
			return err
		}
		sc.ws()
		if sc.i >= len(body) {
			return sc.syntax("EOF while parsing an object")
		}
		switch body[sc.i] {
		case ',':
			sc.i++
		case '}':
			sc.i++
			return sc.end()
		default:
			return sc.syntax("expected `,` or `}`")
		}
	}
}

// member reads the value of the member key (which started at keyStart),
// with the scanner at the value.
func (st *decodeState) member(sc *scanner, key []byte, keyStart int) error {
	switch {
	case st.exact != nil && st.exact.foldedOnly(key):
		// A name the engine does not read: neither does the gateway.
		if err := sc.skipValue(0); err != nil {
			return err
		}
		st.cut(keyStart, sc.i)
	case isTokenKey(key): // under exact names, a folded token_ids was cut above
		if st.seenTokens {
			return sc.shape("duplicate field `token_ids`")
		}
		tokens, null, err := sc.tokenArray(st.tokens, "token_ids")
		st.tokens = tokens
		if err != nil {
			return err
		}
		st.seenTokens, st.tokensFound = true, !null
		st.cut(keyStart, sc.i)
	default:
		if a := st.arrayFor(key); a != nil {
			return st.tokenMember(sc, a, keyStart)
		}
		return sc.skipValue(0)
	}
	return nil
}

// tokenMember reads the value of token member a (its key started at
// keyStart) into a.dst when it is an integer array, and cuts it from what
// goccy gets; any other value, a prompt of strings or a batch of prompts,
// stays in the body for the generic decoder.
func (st *decodeState) tokenMember(sc *scanner, a *tokenMember, keyStart int) error {
	// The last of repeated members is the one the engine reads (Python's
	// json): an earlier integer array no longer counts.
	a.found, *a.dst = false, (*a.dst)[:0]
	if sc.i >= len(sc.b) || sc.b[sc.i] != '[' {
		return sc.skipValue(0)
	}
	start := sc.i
	if toks, _, err := sc.tokenArray(*a.dst, a.name); err == nil {
		*a.dst, a.found = toks, true
		st.cut(keyStart, sc.i)
		return nil
	}
	sc.i = start
	return sc.skipValue(0)
}

// cut records a member goccy does not get.
func (st *decodeState) cut(start, end int) {
	if st.ncut < len(st.cuts) {
		st.cuts[st.ncut] = span{start, end}
		st.ncut++
		return
	}
	st.extra = append(st.extra, span{start, end})
}

// decodeRest hands goccy the body without the members cut.
func (st *decodeState) decodeRest(body []byte, v any) error {
	if st.ncut == 0 {
		return goccyDecode(body, v)
	}
	cuts := st.cuts[:st.ncut]
	if len(st.extra) > 0 {
		cuts = append(cuts[:st.ncut:st.ncut], st.extra...)
	}
	bufp := remainderPool.Get().(*[]byte)
	rest := keepMembers((*bufp)[:0], body, cuts)
	err := goccyDecode(rest, v)
	*bufp = rest
	remainderPool.Put(bufp)
	return err
}

// keepMembers appends the top-level object of body without the members
// cut (spans from a scan that found the body well formed) to dst: the
// members kept, comma-separated, in their order. A cut member is stepped
// over, not scanned again: it may be a 100k-element token array.
func keepMembers(dst, body []byte, cuts []span) []byte {
	sc := scanner{b: body}
	sc.ws()
	sc.i++ // the opening brace
	dst = append(dst, '{')
	kept := 0
	for {
		sc.ws()
		if sc.i >= len(body) || body[sc.i] == '}' {
			break
		}
		start := sc.i
		if len(cuts) > 0 && cuts[0].start == start {
			sc.i, cuts = cuts[0].end, cuts[1:]
		} else {
			_, _ = sc.key()
			sc.ws()
			sc.i++ // the colon
			sc.ws()
			_ = sc.skipValue(0)
			if kept > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, body[start:sc.i]...)
			kept++
		}
		sc.ws()
		if sc.i < len(body) && body[sc.i] == ',' {
			sc.i++
		}
	}
	return append(dst, '}')
}

func isTokenKey(key []byte) bool {
	return len(key) == len("token_ids") && bytes.EqualFold(key, []byte("token_ids"))
}

// goccyDecode decodes body into v and maps goccy's errors to statuses.
func goccyDecode(body []byte, v any) error {
	err := json.Unmarshal(body, v)
	if err == nil {
		return nil
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return &Error{Kind: KindMalformed, Msg: syntaxPrefix + err.Error()}
	}
	var fe *fieldError
	if errors.As(err, &fe) {
		return &Error{Kind: KindUnprocessable, Msg: shapePrefix + fe.Error()}
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return &Error{Kind: KindUnprocessable, Msg: shapePrefix + typeErrorText(te)}
	}
	return &Error{Kind: KindUnprocessable, Msg: shapePrefix + err.Error()}
}

// typeErrorText says what a type error says in serde's words, without
// goccy's Go names (its text named the gateway's Go types and fields):
// "model: invalid type: number, expected a string".
func typeErrorText(e *json.UnmarshalTypeError) string {
	var expected string
	var kind reflect.Kind
	if e.Type != nil {
		kind = e.Type.Kind()
	}
	switch kind {
	case reflect.String:
		expected = "a string"
	case reflect.Bool:
		expected = "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		expected = "an integer"
	case reflect.Float32, reflect.Float64:
		expected = "a number"
	case reflect.Slice, reflect.Array:
		expected = "a sequence"
	default:
		expected = "a map"
	}
	msg := fmt.Sprintf("invalid type: %s, expected %s", e.Value, expected)
	if e.Field != "" {
		msg = e.Field + ": " + msg
	}
	return msg
}

// fieldError is a shape error found by our own element decoders.
type fieldError struct{ msg string }

func (e *fieldError) Error() string { return e.msg }

// UnmarshalPlain decodes a JSON document that carries no prompt into v,
// with the same error statuses as DecodeJSON.
func UnmarshalPlain(body []byte, v any) error { return goccyDecode(body, v) }
