//go:build !amd64

package selection

import "unsafe"

// collectElements is collectCompact where there is no assembly version.
func collectElements(base unsafe.Pointer, masks []uint64, c, start int, words *[groupBlocks * tokenRunRoom]uint64) (int, int, bool) {
	return collectCompact(base, masks, c, start, words)
}

// collectValues takes no block where there is no vector kernel for it.
func collectValues(base unsafe.Pointer, masks []uint64, c, start int, dst unsafe.Pointer) (int, int, int) {
	return start, 0, 0
}
