package selection

import "testing"

// TestTokenRunWordMasks runs the token-array tests with the word mask
// builder on a processor that has AVX2, so both paths of tokenRun are
// tested on it.
func TestTokenRunWordMasks(t *testing.T) {
	if !hasAVX2 {
		t.Skip("no AVX2: the word masks are what the other tests ran")
	}
	hasAVX2 = false
	defer func() { hasAVX2 = true }()
	t.Run("AgainstEncodingJSON", TestTokenRunAgainstEncodingJSON)
	t.Run("BlockBorders", TestTokenRunBlockBorders)
	t.Run("ReusedSlice", TestTokenArrayReusedSlice)
}
