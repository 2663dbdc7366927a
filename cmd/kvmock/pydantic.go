package main

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// vLLM validates its requests with pydantic in lax mode, so a member
// typed bool or int takes more than JSON's own type: "true", 1 or "yes"
// for a bool, "2", 2.0 or true for an int. kvmock reads the members that
// change what it prefills, reads from its cache or streams the same way;
// a value pydantic refuses is a 400, as in vLLM.

// pyBool is a bool read as pydantic's lax mode reads one.
type pyBool bool

func (b *pyBool) UnmarshalJSON(data []byte) error {
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		return err
	}
	switch x := v.(type) {
	case nil:
		*b = false // Optional[bool]: None, which vLLM treats as false
		return nil
	case bool:
		*b = pyBool(x)
		return nil
	case float64:
		if x == 0 || x == 1 {
			*b = x == 1
			return nil
		}
	case string:
		switch strings.ToLower(x) {
		case "1", "on", "t", "true", "y", "yes":
			*b = true
			return nil
		case "0", "off", "f", "false", "n", "no":
			*b = false
			return nil
		}
	}
	return fmt.Errorf("input should be a valid boolean, got %s", data)
}

// pyInt is an int read as pydantic's lax mode reads one.
type pyInt int

func (n *pyInt) UnmarshalJSON(data []byte) error {
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		return err
	}
	switch x := v.(type) {
	case bool:
		*n = 0
		if x {
			*n = 1
		}
		return nil
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1<<53 {
			*n = pyInt(x)
			return nil
		}
	case string:
		s := strings.TrimSpace(x)
		if i := strings.IndexByte(s, '.'); i >= 0 && i < len(s)-1 && strings.Trim(s[i+1:], "0") == "" {
			s = s[:i]
		}
		if i, err := strconv.Atoi(withoutDigitSeparators(s)); err == nil {
			*n = pyInt(i)
			return nil
		}
	}
	return fmt.Errorf("input should be a valid integer, got %s", data)
}

// withoutDigitSeparators is s with Python's digit separators taken out:
// a single underscore with a digit on each side. A string that misuses
// them is given back as it is, and fails to parse.
func withoutDigitSeparators(s string) string {
	groups := strings.Split(s, "_")
	if len(groups) == 1 {
		return s
	}
	for i, g := range groups {
		if g == "" || i > 0 && (g[0] < '0' || g[0] > '9') || i < len(groups)-1 && (g[len(g)-1] < '0' || g[len(g)-1] > '9') {
			return s
		}
	}
	return strings.Join(groups, "")
}

// laxTokenIDs reads a prompt list that is not a list of JSON integers as
// pydantic reads vLLM's prompt union (list[int], list[list[int]], str,
// list[str]) in its smart mode: strings alone match list[str] strictly (a
// batch of texts: isIDs false); a list of scalars otherwise can only be
// list[int] in lax mode, each element a pyInt (7.0, "8", true), and one
// that is not makes the request a 400. A list holding a list or an object
// is not for this reading (isIDs false). In a batch's element (inBatch),
// only list[list[int]] can take the list: strings alone are ids too.
func laxTokenIDs(items []json.RawMessage, inBatch bool) (ids []uint32, isIDs bool, err error) {
	texts := 0
	for _, it := range items {
		switch t := strings.TrimSpace(string(it)); {
		case t == "" || t[0] == '[' || t[0] == '{':
			return nil, false, nil
		case t[0] == '"':
			texts++
		}
	}
	if len(items) == 0 || texts == len(items) && !inBatch {
		return nil, false, nil
	}
	for i, it := range items {
		var n pyInt
		if err := json.Unmarshal(it, &n); err != nil {
			return nil, true, badRequest("prompt[%d]: %v", i, err)
		}
		if n < 0 || n > math.MaxUint32 {
			return nil, true, badRequest("prompt[%d]: token id %d out of range", i, n)
		}
		ids = append(ids, uint32(n))
	}
	return ids, true, nil
}
