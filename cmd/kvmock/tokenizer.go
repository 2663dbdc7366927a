package main

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// The simulated tokenizer, shaped like Llama 3's where a gateway can see
// it. Every worker must turn the same text into the same token ids,
// because the gateway tokenizes through one worker's /tokenize and expects
// another worker to see the same prefix. The scheme:
//
//   - Special tokens (specialTokens) are found first, anywhere in the
//     text, even inside a word, as Hugging Face tokenizers split on them
//     before anything else. Each is one token with Llama 3's id.
//   - The rest is split at Unicode white space, and each word maps to
//     FNV-1a-32(word) mod wordVocab, below every special id.
//   - add_special_tokens prepends BOS (Llama 3 adds no EOS).
//
// White space makes no token, so the tokens of a text are a prefix of the
// tokens of a longer text that starts with it and continues after white
// space or a special token: that is what lets a conversation's next turn
// extend the previous turn's prompt.

// The special tokens' ids, Llama 3's.
const (
	tokBOS             uint32 = 128000 // <|begin_of_text|>
	tokEOS             uint32 = 128001 // <|end_of_text|>
	tokFinetunePad     uint32 = 128004 // <|finetune_right_pad_id|>
	tokStartHeader     uint32 = 128006 // <|start_header_id|>
	tokEndHeader       uint32 = 128007 // <|end_header_id|>
	tokEOM             uint32 = 128008 // <|eom_id|>
	tokEOT             uint32 = 128009 // <|eot_id|>
	tokPythonTag       uint32 = 128010 // <|python_tag|>
	wordVocab                 = 128000 // ordinary words map below this
	vocabSize                 = 128256 // Llama 3's vocabulary, reserved specials included
	maxSpecialTokenLen        = 32     // longer than any special token's text
)

// specialTokens maps each special token's text to its id.
var specialTokens = map[string]uint32{
	"<|begin_of_text|>":         tokBOS,
	"<|end_of_text|>":           tokEOS,
	"<|finetune_right_pad_id|>": tokFinetunePad,
	"<|start_header_id|>":       tokStartHeader,
	"<|end_header_id|>":         tokEndHeader,
	"<|eom_id|>":                tokEOM,
	"<|eot_id|>":                tokEOT,
	"<|python_tag|>":            tokPythonTag,
}

// specialText is the inverse of specialTokens, for token strings.
var specialText = func() map[uint32]string {
	m := make(map[uint32]string, len(specialTokens))
	for s, id := range specialTokens {
		m[id] = s
	}
	return m
}()

// tokenize appends the token ids of text to dst.
func tokenize(dst []uint32, text string) []uint32 {
	eachToken(text, func(id uint32, _ string) { dst = append(dst, id) })
	return dst
}

// eachToken calls f with every token of text and its text, in order.
func eachToken(text string, f func(id uint32, s string)) {
	start := -1 // the current word's first byte
	flush := func(end int) {
		if start >= 0 {
			f(wordToken(text[start:end]), text[start:end])
			start = -1
		}
	}
	for i := 0; i < len(text); {
		if text[i] == '<' {
			if id, n := specialAt(text[i:]); n > 0 {
				flush(i)
				f(id, text[i:i+n])
				i += n
				continue
			}
		}
		r, size := utf8.DecodeRuneInString(text[i:])
		if unicode.IsSpace(r) {
			flush(i)
		} else if start < 0 {
			start = i
		}
		i += size
	}
	flush(len(text))
}

// specialAt reports the special token s starts with: its id and length,
// or a length of 0.
func specialAt(s string) (uint32, int) {
	if !strings.HasPrefix(s, "<|") {
		return 0, 0
	}
	end := strings.Index(s[2:min(len(s), maxSpecialTokenLen)], "|>")
	if end < 0 {
		return 0, 0
	}
	n := 2 + end + 2
	id, ok := specialTokens[s[:n]]
	if !ok {
		return 0, 0
	}
	return id, n
}

// wordToken maps one word to its token id, below the special range.
func wordToken(w string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(w); i++ {
		h ^= uint32(w[i])
		h *= 16777619
	}
	return h % wordVocab
}

// withBOS returns tokens with BOS in front, as a tokenizer's
// add_special_tokens does. It never checks for one already there: neither
// does vLLM, which is how a chat request sent with add_special_tokens
// true gets two.
func withBOS(tokens []uint32) []uint32 {
	return append([]uint32{tokBOS}, tokens...)
}

// outputWords are the texts of generated tokens. Generated text does not
// matter to anyone; it only has to look like text and be cheap.
var outputWords = [...]string{" the", " cache", " is", " warm", " and", " every", " token", " counts", "."}

// outputText is the text of the n-th generated token of a request.
func outputText(n int) string { return outputWords[n%len(outputWords)] }
