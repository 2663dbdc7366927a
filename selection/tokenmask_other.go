//go:build !amd64

package selection

import "unsafe"

// commaMasks is commaMasksWords where there is no vector version.
func commaMasks(p unsafe.Pointer, masks []uint64, carry uint64) (int, bool) {
	return commaMasksWords(p, masks, carry)
}

// digitValues is digitValuesWords where there is no vector version.
func digitValues(words []uint64, dst unsafe.Pointer) { digitValuesWords(words, dst) }
