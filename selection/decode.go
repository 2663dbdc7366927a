package selection

import (
	"bytes"
	"errors"
	"sync"

	json "github.com/goccy/go-json"
)

// Decoding of request bodies. The prompt's token_ids can be 100k elements; it
// is parsed here in one pass straight into a []uint32 (tokenarray.go), and
// everything else in the body (a few small members) goes to goccy/go-json. A
// body without token_ids goes to goccy as it is; a body with it goes as a copy
// of its other members, so goccy never walks the token array.

// promptCarrier is a request type that embeds Prompt.
type promptCarrier interface{ prompt() *Prompt }

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

// DecodeJSON decodes a request body into v (a *SelectRequest,
// *ReservationRequest, *ScoreRequest or any type embedding Prompt). The token
// slice already in v is reused when it has room, so a caller that pools its
// request values decodes without allocating per token. Errors are *Error of
// kind KindMalformed (400) or KindUnprocessable (422) with axum's texts.
func DecodeJSON(body []byte, v promptCarrier) error {
	p := v.prompt()
	st := decodeState{tokens: p.TokenIDs[:0]}
	p.TokenIDs = nil
	if ptc, ok := v.(PromptTokenCarrier); ok {
		st.promptDst = ptc.PromptTokens()
		*st.promptDst = (*st.promptDst)[:0]
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
	p.TokenIDs = nil
	if st.tokensFound {
		p.TokenIDs = st.tokens
	}
	if st.promptDst != nil && !st.promptFound {
		*st.promptDst = nil // no integer-array prompt: not a reused buffer's leftovers
	}
	return nil
}

// decodeState is what DecodeJSON's pass over the top-level object has
// found: the token arrays parsed in place, and where they were, so that
// goccy gets the body without them.
type decodeState struct {
	tokens      []uint32  // token_ids, into the caller's reused buffer
	promptDst   *[]uint32 // where an integer-array "prompt" goes; nil when v takes none
	seenTokens  bool      // a token_ids member was read: another is a duplicate
	tokensFound bool      // and it was not null
	promptFound bool      // an integer-array prompt was read into promptDst
	cuts        [2]span   // the members parsed here, in body order
	ncut        int
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
	case isTokenKey(key):
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
	case st.promptDst != nil && !st.promptFound && sc.i < len(sc.b) && sc.b[sc.i] == '[' && string(key) == "prompt":
		// Try it as token ids; a prompt of strings or a batch of
		// prompts stays in the body for the generic decoder.
		start := sc.i
		if toks, _, err := sc.tokenArray(*st.promptDst, "prompt"); err == nil {
			*st.promptDst, st.promptFound = toks, true
			st.cut(keyStart, sc.i)
			return nil
		}
		sc.i = start
		return sc.skipValue(0)
	default:
		return sc.skipValue(0)
	}
	return nil
}

// cut records a member parsed here. There are at most two: a second
// token_ids is refused, and only the first integer-array prompt is taken.
func (st *decodeState) cut(start, end int) {
	st.cuts[st.ncut] = span{start, end}
	st.ncut++
}

// decodeRest hands goccy the body without the members parsed here.
func (st *decodeState) decodeRest(body []byte, v any) error {
	if st.ncut == 0 {
		return goccyDecode(body, v)
	}
	bufp := remainderPool.Get().(*[]byte)
	rest := (*bufp)[:0]
	if st.ncut == 1 {
		rest = removeMember(rest, body, st.cuts[0].start, st.cuts[0].end)
	} else {
		// Remove the later member first, from a copy, then the earlier.
		first, second := st.cuts[0], st.cuts[1]
		tmp := removeMember(nil, body, second.start, second.end)
		rest = removeMember(rest, tmp, first.start, first.end)
	}
	err := goccyDecode(rest, v)
	*bufp = rest
	remainderPool.Put(bufp)
	return err
}

// removeMember appends body without the object member [start, end) to dst.
func removeMember(dst, body []byte, start, end int) []byte {
	// Look back for the comma before the member; if there is none, the
	// member is first and the comma after it must go instead.
	j := start - 1
	for j >= 0 && isSpace(body[j]) {
		j--
	}
	if body[j] == ',' {
		dst = append(dst, body[:j]...)
		return append(dst, body[end:]...)
	}
	k := end
	for k < len(body) && isSpace(body[k]) {
		k++
	}
	if k < len(body) && body[k] == ',' {
		k++
	}
	dst = append(dst, body[:start]...)
	return append(dst, body[k:]...)
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
	return &Error{Kind: KindUnprocessable, Msg: shapePrefix + err.Error()}
}

// fieldError is a shape error found by our own element decoders.
type fieldError struct{ msg string }

func (e *fieldError) Error() string { return e.msg }

// UnmarshalPlain decodes a JSON document that carries no prompt into v,
// with the same error statuses as DecodeJSON.
func UnmarshalPlain(body []byte, v any) error { return goccyDecode(body, v) }
