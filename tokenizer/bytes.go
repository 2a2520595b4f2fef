package tokenizer

import (
	"unicode/utf8"
)

// byteToRune is GPT-2's byte-level alphabet: every byte gets a printable
// rune so that BPE vocabularies can be stored as text. Bytes that are
// printable Latin-1 map to themselves; the rest (controls, space, 0x7F-0xA0,
// 0xAD) map to U+0100 upwards in byte order.
var byteToRune [256]rune

// runeToByte inverts byteToRune. Runes outside the alphabet are absent.
var runeToByte map[rune]byte

func init() {
	printable := func(b int) bool {
		return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
	}
	runeToByte = make(map[rune]byte, 256)
	next := rune(256)
	for b := 0; b < 256; b++ {
		if printable(b) {
			byteToRune[b] = rune(b)
		} else {
			byteToRune[b] = next
			next++
		}
		runeToByte[byteToRune[b]] = byte(b)
	}
}

// byteLevelDecode maps a byte-level piece back to its bytes. ok is false if
// some rune is outside the alphabet (HF then keeps the piece's own UTF-8).
func byteLevelDecode(piece string) (b []byte, ok bool) {
	b = make([]byte, 0, len(piece))
	for _, r := range piece {
		c, found := runeToByte[r]
		if !found {
			return nil, false
		}
		b = append(b, c)
	}
	return b, true
}

// utf8SeqEnd reports how a UTF-8 sequence starting at s[0] ends, following
// the Unicode "maximal subpart" rule that Rust's String::from_utf8_lossy and
// Python's errors="replace" use: n is the number of bytes consumed, valid
// says whether they form a character, and incomplete says that s ended
// inside a sequence that more bytes could still complete.
func utf8SeqEnd(s []byte) (n int, valid, incomplete bool) {
	b0 := s[0]
	if b0 < 0x80 {
		return 1, true, false
	}
	var need int
	lo, hi := byte(0x80), byte(0xBF)
	switch {
	case b0 >= 0xC2 && b0 <= 0xDF:
		need = 1
	case b0 == 0xE0:
		need, lo = 2, 0xA0
	case b0 >= 0xE1 && b0 <= 0xEC, b0 == 0xEE, b0 == 0xEF:
		need = 2
	case b0 == 0xED:
		need, hi = 2, 0x9F
	case b0 == 0xF0:
		need, lo = 3, 0x90
	case b0 >= 0xF1 && b0 <= 0xF3:
		need = 3
	case b0 == 0xF4:
		need, hi = 3, 0x8F
	default:
		return 1, false, false
	}
	for k := 1; k <= need; k++ {
		if k >= len(s) {
			return k, false, true
		}
		c := s[k]
		if k == 1 {
			if c < lo || c > hi {
				return 1, false, false
			}
		} else if c < 0x80 || c > 0xBF {
			return k, false, false
		}
	}
	return need + 1, true, false
}

// appendLossy appends s to dst as valid UTF-8, replacing each maximal
// invalid subpart with U+FFFD. If final is false, an incomplete sequence at
// the end of s is left out and its length returned as held, so that a
// streaming caller can retry it with more bytes.
func appendLossy(dst, s []byte, final bool) (out []byte, held int) {
	i := 0
	for i < len(s) {
		if s[i] < 0x80 {
			dst = append(dst, s[i])
			i++
			continue
		}
		n, valid, incomplete := utf8SeqEnd(s[i:])
		switch {
		case valid:
			dst = append(dst, s[i:i+n]...)
		case incomplete && !final:
			return dst, len(s) - i
		default:
			dst = append(dst, "\uFFFD"...)
		}
		i += n
	}
	return dst, 0
}

// toValidUTF8 replaces each maximal invalid subpart of s with U+FFFD.
func toValidUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	out, _ := appendLossy(make([]byte, 0, len(s)+8), []byte(s), true)
	return string(out)
}
