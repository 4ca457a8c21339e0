package main

// Model references as Ollama v0.24.0 reads them: internal/modelref/modelref.go
// (whitespace trim, ":cloud"/"-cloud"/":local" source suffixes) and
// types/model/name.go (ParseName, IsValid, DisplayShortest).

import (
	"cmp"
	"errors"
	"fmt"
	"strings"
)

const (
	sourceUnspecified = iota
	sourceLocal
	sourceCloud
)

var (
	errConflictingSource = errors.New("use either :local or :cloud, not both")
	errModelRequired     = errors.New("model is required")
	errUnqualifiedName   = errors.New("unqualified name")
)

// modelRef is server/model_resolver.go parsedModelRef.
type modelRef struct {
	Base   string
	Name   modelName
	Source int
}

// parseAndValidateModelRef is server/model_resolver.go parseAndValidateModelRef
// with internal/modelref/modelref.go ParseRef inlined.
func parseAndValidateModelRef(raw string) (modelRef, error) {
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return modelRef{}, errModelRequired
	}
	base, source, explicit := parseSourceSuffix(raw)
	if explicit {
		if _, _, nested := parseSourceSuffix(base); nested {
			return modelRef{}, fmt.Errorf("%w: %q", errConflictingSource, raw)
		}
	}
	name := parseName(base)
	if !name.isValid() {
		return modelRef{}, fmt.Errorf("%w: %s", errUnqualifiedName, name.String())
	}
	return modelRef{Base: base, Name: name, Source: source}, nil
}

// parseSourceSuffix is internal/modelref/modelref.go parseSourceSuffix.
func parseSourceSuffix(raw string) (string, int, bool) {
	idx := strings.LastIndex(raw, ":")
	if idx >= 0 {
		suffixRaw := strings.TrimSpace(raw[idx+1:])
		suffix := strings.ToLower(suffixRaw)
		switch suffix {
		case "cloud":
			return raw[:idx], sourceCloud, true
		case "local":
			return raw[:idx], sourceLocal, true
		}
		if !strings.Contains(suffixRaw, "/") && strings.HasSuffix(suffix, "-cloud") {
			return raw[:idx+1] + suffixRaw[:len(suffixRaw)-len("-cloud")], sourceCloud, true
		}
	}
	return raw, sourceUnspecified, false
}

// modelName is types/model/name.go Name (the protocol scheme is not needed).
type modelName struct {
	Host, Namespace, Model, Tag string
}

const missingPart = "!MISSING!"

// parseName is types/model/name.go ParseName: ParseNameBare merged with the defaults.
func parseName(s string) modelName {
	var n modelName
	var promised bool
	if strings.LastIndex(s, ":") > strings.LastIndex(s, "/") {
		s, n.Tag, _ = cutPromised(s, ":")
	}
	s, n.Model, promised = cutPromised(s, "/")
	if !promised {
		n.Model = s
	} else {
		s, n.Namespace, promised = cutPromised(s, "/")
		if !promised {
			n.Namespace = s
		} else {
			scheme, host, ok := strings.Cut(s, "://")
			if !ok {
				host = scheme
			}
			n.Host = host
		}
	}
	n.Host = cmp.Or(n.Host, "registry.ollama.ai")
	n.Namespace = cmp.Or(n.Namespace, "library")
	n.Tag = cmp.Or(n.Tag, "latest")
	return n
}

// cutPromised is types/model/name.go cutPromised.
func cutPromised(s, sep string) (string, string, bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return cmp.Or(s[:i], missingPart), cmp.Or(s[i+len(sep):], missingPart), true
}

// String is types/model/name.go Name.String.
func (n modelName) String() string {
	var b strings.Builder
	if n.Host != "" {
		b.WriteString(n.Host + "/")
	}
	if n.Namespace != "" {
		b.WriteString(n.Namespace + "/")
	}
	b.WriteString(n.Model)
	if n.Tag != "" {
		b.WriteString(":" + n.Tag)
	}
	return b.String()
}

// DisplayShortest is types/model/name.go Name.DisplayShortest: the form
// /api/ps and /api/tags show, e.g. "tiny:latest".
func (n modelName) DisplayShortest() string {
	var sb strings.Builder
	if !strings.EqualFold(n.Host, "registry.ollama.ai") {
		sb.WriteString(n.Host + "/" + n.Namespace + "/")
	} else if !strings.EqualFold(n.Namespace, "library") {
		sb.WriteString(n.Namespace + "/")
	}
	sb.WriteString(n.Model + ":" + n.Tag)
	return sb.String()
}

// isValid is types/model/name.go Name.IsValid (IsFullyQualified).
func (n modelName) isValid() bool {
	for kind, part := range []string{n.Host, n.Namespace, n.Model, n.Tag} {
		if !isValidPart(kind, part) {
			return false
		}
	}
	return true
}

const (
	kindHost = iota
	kindNamespace
	kindModel
	kindTag
)

// isValidPart is types/model/name.go isValidPart: it ranges over runes but
// tests the byte at each rune's start, so any non-ASCII character fails.
func isValidPart(kind int, s string) bool {
	maxLen := 80
	if kind == kindHost {
		maxLen = 350
	}
	if len(s) < 1 || len(s) > maxLen {
		return false
	}
	for i := range s {
		if i == 0 {
			if !isAlnumOrUnderscore(s[i]) {
				return false
			}
			continue
		}
		switch s[i] {
		case '_', '-':
		case '.':
			if kind == kindNamespace {
				return false
			}
		case ':':
			if kind != kindHost {
				return false
			}
		default:
			if !isAlnumOrUnderscore(s[i]) {
				return false
			}
		}
	}
	return true
}

func isAlnumOrUnderscore(c byte) bool {
	return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_'
}
