package caddymodule

import (
	"unicode/utf16"
	"unicode/utf8"
)

// unescapeShort decodes item, a JSON string of valid JSON, into buf
// (the caller's array, so that a short one costs no allocation); ok is
// false when the text does not fit in buf, for the caller to decode it
// otherwise. A prompt of ids written with escapes ("\u0031\u0032") made a
// string of each element: 16 MiB of them, 0.3 s of CPU against 10-20 ms
// for integers. A lone surrogate decodes to U+FFFD, as Go's decoder
// does; no such text is an integer either way.
func unescapeShort(item []byte, buf []byte) (text []byte, ok bool) {
	if len(item) < 2 || item[0] != '"' {
		return nil, false
	}
	out := buf[:0]
	body := item[1 : len(item)-1]
	for i := 0; i < len(body); i++ {
		c := body[i]
		if c != '\\' {
			if len(out) == cap(out) {
				return nil, false
			}
			out = append(out, c)
			continue
		}
		i++
		var r rune
		switch body[i] {
		case 'b':
			r = '\b'
		case 'f':
			r = '\f'
		case 'n':
			r = '\n'
		case 'r':
			r = '\r'
		case 't':
			r = '\t'
		case 'u':
			r = hex4(body[i+1 : i+5])
			i += 4
			if utf16.IsSurrogate(r) {
				r2 := utf8.RuneError
				if i+6 < len(body) && body[i+1] == '\\' && body[i+2] == 'u' {
					r2 = hex4(body[i+3 : i+7])
				}
				if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
					r, i = d, i+6
				} else {
					r = utf8.RuneError
				}
			}
		default: // '"', '\\', '/'
			r = rune(body[i])
		}
		if len(out)+utf8.RuneLen(r) > cap(out) {
			return nil, false
		}
		out = utf8.AppendRune(out, r)
	}
	return out, true
}

// hex4 is four hex digits' value (valid JSON: they are hex digits).
func hex4(h []byte) rune {
	var r rune
	for _, c := range h {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		default:
			r = r<<4 | rune(c-'A'+10)
		}
	}
	return r
}
