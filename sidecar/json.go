package sidecar

import (
	"encoding/json"
	"strconv"
	"unicode/utf8"

	"github.com/shardvisor/shardvisor/router"
)

// The routing answers' wire format (docs/router-api.md), which the Python
// client and the routing vectors parse. Written by hand, without
// reflection: GET /v1/route is the sidecar's hot path (docs/router-api.md's
// budget: at least 0.8x a constant handler). json_test.go checks the bytes
// against encoding/json's of the documented fields.

// JSONRoute is a route as the API writes it, for callers that encode it
// themselves (shardctl route --json).
func JSONRoute(uid string, rt router.Route) json.RawMessage { return appendRoute(nil, uid, rt) }

// appendBatch writes POST /v1/route's answer: the map version and the
// routes of uids, in order.
func appendBatch(b []byte, version uint64, uids []string, routes []router.Route) []byte {
	b = append(b, `{"map_version":`...)
	b = strconv.AppendUint(b, version, 10)
	b = append(b, `,"routes":[`...)
	for i, rt := range routes {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendRoute(b, uids[i], rt)
	}
	return append(b, "]}"...)
}

// readyAnswer is GET /readyz's answer once a map is loaded.
type readyAnswer struct {
	Ready      bool          `json:"ready"`
	MapVersion uint64        `json:"map_version"`
	ZKState    string        `json:"zk_state"`
	Source     router.Source `json:"source"`
}

// errorAnswer is every error's answer.
type errorAnswer struct {
	Error string `json:"error"`
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string. (strconv.AppendQuote writes
// Go escapes such as \x00, which are not JSON.)
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default:
			b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		start = i + 1
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// appendRoute writes a route as JSON without reflection: this is the
// sidecar's hot path.
func appendRoute(b []byte, uid string, rt router.Route) []byte {
	b = append(b, `{"uid":`...)
	b = appendJSONString(b, uid)
	b = append(b, `,"bucket":`...)
	b = strconv.AppendUint(b, uint64(rt.Bucket), 10)
	b = append(b, `,"level":`...)
	b = strconv.AppendInt(b, int64(rt.Level), 10)
	b = append(b, `,"node":`...)
	b = appendJSONString(b, string(rt.Node))
	b = append(b, `,"dsn":`...)
	b = appendJSONString(b, rt.DSN)
	if rt.PoolDSN != "" {
		b = append(b, `,"pool_dsn":`...)
		b = appendJSONString(b, rt.PoolDSN)
	}
	if rt.Group != "" {
		b = append(b, `,"group":`...)
		b = appendJSONString(b, rt.Group)
	}
	b = append(b, `,"map_version":`...)
	b = strconv.AppendUint(b, rt.MapVersion, 10)
	b = append(b, `,"state":`...)
	b = appendJSONString(b, string(rt.State))
	if rt.Target != "" {
		b = append(b, `,"target":`...)
		b = appendJSONString(b, string(rt.Target))
	}
	b = append(b, `,"data_lost":`...)
	b = strconv.AppendBool(b, rt.DataLost)
	b = append(b, `,"suspended":`...)
	b = strconv.AppendBool(b, rt.Suspended)
	b = append(b, `,"stale":`...)
	b = strconv.AppendBool(b, rt.Stale)
	b = append(b, `,"moved":`...)
	b = strconv.AppendBool(b, rt.Moved)
	if rt.Moved {
		b = append(b, `,"moved_from":`...)
		b = appendJSONString(b, string(rt.MovedFrom))
	}
	return append(b, '}')
}

// validJSONText reports whether JSON text is valid UTF-8 and every \u
// escape in it is a character: a surrogate only as a high-low pair.
// (Outside strings JSON has no backslash, so escapes are found by
// scanning the whole text.)
func validJSONText(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' {
			continue
		}
		i++
		if i >= len(b) || b[i] != 'u' {
			continue // \" \\ \/ \n ...: one character, skipped
		}
		r, ok := hex4(b[i+1:])
		if !ok {
			return false
		}
		i += 4
		switch {
		case r >= 0xDC00 && r < 0xE000:
			return false // a low surrogate alone
		case r >= 0xD800 && r < 0xDC00:
			if i+6 >= len(b) || b[i+1] != '\\' || b[i+2] != 'u' {
				return false
			}
			if lo, ok := hex4(b[i+3:]); !ok || lo < 0xDC00 || lo >= 0xE000 {
				return false
			}
			i += 6
		}
	}
	return true
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}
