package main

import (
	"strings"
	"unicode"
)

// The simulated tokenizer. Every worker must turn the same text into the
// same token ids, because the gateway tokenizes through one worker's
// /tokenize and expects another worker to see the same prefix. The scheme:
// split the text at Unicode white space, and map each word to
// FNV-1a-32(word) mod vocabSize. There are no special tokens (no BOS), so
// the tokens of a text are always a prefix of the tokens of a longer text
// that starts with it and continues after white space.
const vocabSize = 150000

// tokenize appends the token ids of text to dst.
func tokenize(dst []uint32, text string) []uint32 {
	start := -1
	for i, r := range text {
		if unicode.IsSpace(r) {
			if start >= 0 {
				dst = append(dst, wordToken(text[start:i]))
				start = -1
			}
		} else if start < 0 {
			start = i
		}
	}
	if start >= 0 {
		dst = append(dst, wordToken(text[start:]))
	}
	return dst
}

// wordToken maps one word to its token id.
func wordToken(w string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(w); i++ {
		h ^= uint32(w[i])
		h *= 16777619
	}
	return h % vocabSize
}

// chatMessage is one message of a chat request. Content is a string or a
// list of parts, of which the text parts count.
type chatMessage struct {
	Role    string
	Content string
}

// renderChat is the chat template: each message becomes the word
// "<|role|>" followed by its content, and with a generation prompt the
// text ends in "<|assistant|>". A conversation's next turn therefore
// extends the previous turn's tokens, which is what makes multi-turn
// prefix caching work, as it does with real templates.
func renderChat(msgs []chatMessage, addGenerationPrompt bool) string {
	var b strings.Builder
	for _, m := range msgs {
		b.WriteString("<|")
		b.WriteString(m.Role)
		b.WriteString("|> ")
		b.WriteString(m.Content)
		b.WriteByte('\n')
	}
	if addGenerationPrompt {
		b.WriteString("<|assistant|>")
	}
	return b.String()
}

// outputWords are the texts of generated tokens. Generated text does not
// matter to anyone; it only has to look like text and be cheap.
var outputWords = [...]string{" the", " cache", " is", " warm", " and", " every", " token", " counts", "."}

// outputText is the text of the n-th generated token of a request.
func outputText(n int) string { return outputWords[n%len(outputWords)] }
