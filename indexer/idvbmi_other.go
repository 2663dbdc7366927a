//go:build !amd64

package indexer

// readIDQuadsVector takes no id where there is no vector kernel:
// readIDQuads' Go loop reads them all.
func readIDQuadsVector(out []uint32, b []byte, k, i int) (int, int) { return k, i }
