package main

// Ollama decodes tool-call arguments and tool-parameter properties into an
// insertion-ordered map whose decoder is not encoding/json's: the chain is
// api.ToolCallFunctionArguments -> internal/orderedmap.Map -> wk8/go-ordered-map
// v2.1.8 OrderedMap.UnmarshalJSON -> buger/jsonparser v1.1.1 ObjectEach. That
// chain refuses inputs encoding/json would take (a non-object value, a key that
// is not valid UTF-8, a key escape jsonparser cannot unescape) and accepts null
// through the pointer indirection, so the copies below keep the same shape.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"
)

// orderedMap mirrors internal/orderedmap/orderedmap.go Map: a pointer to the
// wk8 map, so that JSON null resets the pointer instead of reaching ObjectEach.
type orderedMap[V any] struct {
	om *wkMap[V]
}

// UnmarshalJSON is internal/orderedmap/orderedmap.go Map.UnmarshalJSON.
func (m *orderedMap[V]) UnmarshalJSON(data []byte) error {
	m.om = &wkMap[V]{}
	return json.Unmarshal(data, &m.om)
}

// MarshalJSON writes the keys in insertion order, as the wk8 map does.
func (m *orderedMap[V]) MarshalJSON() ([]byte, error) {
	if m == nil || m.om == nil {
		return []byte("null"), nil
	}
	return m.om.MarshalJSON()
}

func (m *orderedMap[V]) empty() bool { return m == nil || m.om == nil }

// wkMap stands in for wk8/go-ordered-map/v2 OrderedMap[string, V].
type wkMap[V any] struct {
	keys   []string
	values map[string]V
}

func (om *wkMap[V]) set(key string, value V) {
	if om.values == nil {
		om.values = map[string]V{}
	}
	if _, ok := om.values[key]; !ok {
		om.keys = append(om.keys, key)
	}
	om.values[key] = value
}

// MarshalJSON follows wk8 json.go MarshalJSON: keys in order, values through
// encoding/json.
func (om *wkMap[V]) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, k := range om.keys {
		if i > 0 {
			b.WriteByte(',')
		}
		kb, err := json.Marshal(k)
		if err != nil {
			return nil, err
		}
		vb, err := json.Marshal(om.values[k])
		if err != nil {
			return nil, err
		}
		b.Write(kb)
		b.WriteByte(':')
		b.Write(vb)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// UnmarshalJSON is wk8/go-ordered-map v2.1.8 json.go UnmarshalJSON for string
// keys: jsonparser.ObjectEach, the key checked by decodeUTF8, the value (a
// string with its quotes restored) decoded by encoding/json.
func (om *wkMap[V]) UnmarshalJSON(data []byte) error {
	return jpObjectEach(data, func(keyData, valueData []byte, dataType jpType, offset int) error {
		if dataType == jpString {
			valueData = data[offset-len(valueData)-2 : offset]
		}
		key, err := wkDecodeUTF8(keyData)
		if err != nil {
			return err
		}
		var value V
		if err := json.Unmarshal(valueData, &value); err != nil {
			return err
		}
		om.set(key, value)
		return nil
	})
}

// wkDecodeUTF8 is wk8 json.go decodeUTF8.
func wkDecodeUTF8(input []byte) (string, error) {
	remaining, offset := input, 0
	runes := make([]rune, 0, len(remaining))
	for len(remaining) > 0 {
		r, size := utf8.DecodeRune(remaining)
		if r == utf8.RuneError && size <= 1 {
			return "", fmt.Errorf("not a valid UTF-8 string (at position %d): %s", offset, string(input))
		}
		runes = append(runes, r)
		remaining = remaining[size:]
		offset += size
	}
	return string(runes), nil
}

// The rest of this file is the part of buger/jsonparser v1.1.1 (parser.go,
// escape.go) that ObjectEach without a key path reaches.

type jpType int

const (
	jpNotExist jpType = iota
	jpString
	jpNumber
	jpObject
	jpArray
	jpBoolean
	jpNull
	jpUnknown
)

var (
	errJPUnknownValueType  = errors.New("Unknown value type")
	errJPMalformedJSON     = errors.New("Malformed JSON error")
	errJPMalformedString   = errors.New("Value is string, but can't find closing '\"' symbol")
	errJPMalformedArray    = errors.New("Value is array, but can't find closing ']' symbol")
	errJPMalformedObject   = errors.New("Value looks like object, but can't find closing '}' symbol")
	errJPMalformedValue    = errors.New("Value looks like Number/Boolean/None, but can't find its end: ',' or '}' symbol")
	errJPMalformedEscape   = errors.New("Encountered an invalid escape sequence in a string")
	jpTrueLiteral          = []byte("true")
	jpFalseLiteral         = []byte("false")
	jpNullLiteral          = []byte("null")
	jpBackslashEscapeTable = [...]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}
)

// jpTokenEnd is parser.go tokenEnd.
func jpTokenEnd(data []byte) int {
	for i, c := range data {
		switch c {
		case ' ', '\n', '\r', '\t', ',', '}', ']':
			return i
		}
	}
	return len(data)
}

// jpNextToken is parser.go nextToken.
func jpNextToken(data []byte) int {
	for i, c := range data {
		switch c {
		case ' ', '\n', '\r', '\t':
			continue
		default:
			return i
		}
	}
	return -1
}

// jpStringEnd is parser.go stringEnd.
func jpStringEnd(data []byte) (int, bool) {
	escaped := false
	for i, c := range data {
		if c == '"' {
			if !escaped {
				return i + 1, false
			}
			j := i - 1
			for {
				if j < 0 || data[j] != '\\' {
					return i + 1, true
				}
				j--
				if j < 0 || data[j] != '\\' {
					break
				}
				j--
			}
		} else if c == '\\' {
			escaped = true
		}
	}
	return -1, escaped
}

// jpBlockEnd is parser.go blockEnd.
func jpBlockEnd(data []byte, openSym, closeSym byte) int {
	level := 0
	for i := 0; i < len(data); i++ {
		switch data[i] {
		case '"':
			se, _ := jpStringEnd(data[i+1:])
			if se == -1 {
				return -1
			}
			i += se
		case openSym:
			level++
		case closeSym:
			level--
			if level == 0 {
				return i + 1
			}
		}
	}
	return -1
}

// jpGetType is parser.go getType.
func jpGetType(data []byte, offset int) ([]byte, jpType, int, error) {
	var dataType jpType
	endOffset := offset
	switch data[offset] {
	case '"':
		dataType = jpString
		idx, _ := jpStringEnd(data[offset+1:])
		if idx == -1 {
			return nil, dataType, offset, errJPMalformedString
		}
		endOffset += idx + 1
	case '[':
		dataType = jpArray
		endOffset = jpBlockEnd(data[offset:], '[', ']')
		if endOffset == -1 {
			return nil, dataType, offset, errJPMalformedArray
		}
		endOffset += offset
	case '{':
		dataType = jpObject
		endOffset = jpBlockEnd(data[offset:], '{', '}')
		if endOffset == -1 {
			return nil, dataType, offset, errJPMalformedObject
		}
		endOffset += offset
	default:
		end := jpTokenEnd(data[endOffset:])
		if end == -1 {
			return nil, dataType, offset, errJPMalformedValue
		}
		value := data[offset : endOffset+end]
		switch data[offset] {
		case 't', 'f':
			if !bytes.Equal(value, jpTrueLiteral) && !bytes.Equal(value, jpFalseLiteral) {
				return nil, jpUnknown, offset, errJPUnknownValueType
			}
			dataType = jpBoolean
		case 'u', 'n':
			if !bytes.Equal(value, jpNullLiteral) {
				return nil, jpUnknown, offset, errJPUnknownValueType
			}
			dataType = jpNull
		case '0', '1', '2', '3', '4', '5', '6', '7', '8', '9', '-':
			dataType = jpNumber
		default:
			return nil, jpUnknown, offset, errJPUnknownValueType
		}
		endOffset += end
	}
	return data[offset:endOffset], dataType, endOffset, nil
}

// jpGet is parser.go Get without a key path.
func jpGet(data []byte) ([]byte, jpType, int, error) {
	nO := jpNextToken(data)
	if nO == -1 {
		return nil, jpNotExist, -1, errJPMalformedJSON
	}
	value, dataType, endOffset, err := jpGetType(data, nO)
	if err != nil {
		return value, dataType, endOffset, err
	}
	if dataType == jpString {
		value = value[1 : len(value)-1]
	}
	return value, dataType, endOffset, nil
}

// jpObjectEach is parser.go ObjectEach without a key path.
func jpObjectEach(data []byte, callback func(key, value []byte, dataType jpType, offset int) error) error {
	offset := 0
	if off := jpNextToken(data[offset:]); off == -1 {
		return errJPMalformedObject
	} else if offset += off; data[offset] != '{' {
		return errJPMalformedObject
	}
	offset++
	if off := jpNextToken(data[offset:]); off == -1 {
		return errJPMalformedJSON
	} else if offset += off; data[offset] == '}' {
		return nil
	}
	for offset < len(data) {
		switch data[offset] {
		case '"':
			offset++
		case '}':
			return nil
		default:
			return errJPMalformedObject
		}
		off, keyEscaped := jpStringEnd(data[offset:])
		if off == -1 {
			return errJPMalformedJSON
		}
		key := data[offset : offset+off-1]
		offset += off
		if keyEscaped {
			unescaped, err := jpUnescape(key)
			if err != nil {
				return errJPMalformedEscape
			}
			key = unescaped
		}
		if off := jpNextToken(data[offset:]); off == -1 {
			return errJPMalformedJSON
		} else if offset += off; data[offset] != ':' {
			return errJPMalformedJSON
		}
		offset++
		value, valueType, off, err := jpGet(data[offset:])
		if err != nil {
			return err
		}
		if err := callback(key, value, valueType, offset+off); err != nil {
			return err
		}
		offset += off
		if off := jpNextToken(data[offset:]); off == -1 {
			return errJPMalformedArray
		} else {
			offset += off
			switch data[offset] {
			case '}':
				return nil
			case ',':
				offset++
			default:
				return errJPMalformedObject
			}
		}
		if off := jpNextToken(data[offset:]); off == -1 {
			return errJPMalformedArray
		} else {
			offset += off
		}
	}
	return errJPMalformedObject
}

// jpH2I is escape.go h2I.
func jpH2I(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'A' && c <= 'F':
		return int(c - 'A' + 10)
	case c >= 'a' && c <= 'f':
		return int(c - 'a' + 10)
	}
	return -1
}

// jpDecodeSingleUnicodeEscape is escape.go decodeSingleUnicodeEscape: the
// "\u" prefix is not checked, only the four hex digits after it.
func jpDecodeSingleUnicodeEscape(in []byte) (rune, bool) {
	if len(in) < 6 {
		return utf8.RuneError, false
	}
	h1, h2, h3, h4 := jpH2I(in[2]), jpH2I(in[3]), jpH2I(in[4]), jpH2I(in[5])
	if h1 == -1 || h2 == -1 || h3 == -1 || h4 == -1 {
		return utf8.RuneError, false
	}
	return rune(h1<<12 + h2<<8 + h3<<4 + h4), true
}

// jpDecodeUnicodeEscape is escape.go decodeUnicodeEscape: a lone surrogate is
// an error, unlike encoding/json which substitutes U+FFFD.
func jpDecodeUnicodeEscape(in []byte) (rune, int) {
	r, ok := jpDecodeSingleUnicodeEscape(in)
	if !ok {
		return utf8.RuneError, -1
	}
	if r <= 0xFFFF && !(0xD800 <= r && r <= 0xDFFF) {
		return r, 6
	}
	r2, ok := jpDecodeSingleUnicodeEscape(in[6:])
	if !ok || r2 < 0xDC00 {
		return utf8.RuneError, -1
	}
	return 0x10000 + (r-0xD800)<<10 + (r2 - 0xDC00), 12
}

// jpUnescape is escape.go Unescape (with unescapeToUTF8 folded in).
func jpUnescape(in []byte) ([]byte, error) {
	var out []byte
	for len(in) > 0 {
		i := bytes.IndexByte(in, '\\')
		if i == -1 {
			out = append(out, in...)
			break
		}
		out = append(out, in[:i]...)
		in = in[i:]
		if len(in) < 2 {
			return nil, errJPMalformedEscape
		}
		switch e := in[1]; e {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			out = append(out, jpBackslashEscapeTable[e])
			in = in[2:]
		case 'u':
			r, n := jpDecodeUnicodeEscape(in)
			if n == -1 {
				return nil, errJPMalformedEscape
			}
			out = utf8.AppendRune(out, r)
			in = in[n:]
		default:
			return nil, errJPMalformedEscape
		}
	}
	return out, nil
}
