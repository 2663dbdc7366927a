package main

import (
	"slices"
	"testing"
)

func TestSpecialTokensSplitWithoutWhiteSpace(t *testing.T) {
	got := tokenize(nil, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi there<|eot_id|>x<|python_tag|>{}")
	want := []uint32{tokBOS, tokStartHeader, wordToken("user"), tokEndHeader, wordToken("hi"), wordToken("there"),
		tokEOT, wordToken("x"), tokPythonTag, wordToken("{}")}
	if !slices.Equal(got, want) {
		t.Fatalf("tokens %v, want %v", got, want)
	}
	// Text that only looks like a special token is words.
	if got := tokenize(nil, "<|nope|> <|eot_id"); len(got) != 2 || slices.Contains(got, tokEOT) {
		t.Fatalf("tokens %v", got)
	}
	for _, id := range []uint32{tokBOS, tokEOS, tokStartHeader, tokEndHeader, tokEOM, tokEOT, tokPythonTag} {
		if id < wordVocab || id >= vocabSize || specialTokens[specialText[id]] != id {
			t.Fatalf("special id %d out of place", id)
		}
	}
}

func TestWordsStayBelowTheSpecialRange(t *testing.T) {
	for _, w := range []string{"a", "hello", "<|", "|>", words("w", 1000)} {
		for _, id := range tokenize(nil, w) {
			if id >= wordVocab {
				t.Fatalf("%q gave id %d", w, id)
			}
		}
	}
}

func TestTokenizeIsAPrefixAcrossSeparators(t *testing.T) {
	a := "<|begin_of_text|>some words<|eot_id|>"
	for _, more := range []string{" and more", "<|start_header_id|>x", "\nnext"} {
		ta, tb := tokenize(nil, a), tokenize(nil, a+more)
		if len(tb) <= len(ta) || !slices.Equal(tb[:len(ta)], ta) {
			t.Fatalf("%q: %v is not a prefix of %v", more, ta, tb)
		}
	}
	if got := withBOS([]uint32{tokBOS, 5}); !slices.Equal(got, []uint32{tokBOS, tokBOS, 5}) {
		t.Fatalf("withBOS %v", got)
	}
}
