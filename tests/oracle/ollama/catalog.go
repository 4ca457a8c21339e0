package main

// The installed models, as the upstream lists them: Ollama's handlers look a
// name up among the manifests on disk, which this oracle cannot see, so it
// asks the upstream's /api/tags (and /api/show for capabilities) instead.

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"time"
)

type installed struct {
	name   modelName
	caps   []string
	remote bool
}

type catalog struct {
	upstream string
	client   *http.Client
	mu       sync.Mutex
	models   []installed
}

func newCatalog(upstream string) *catalog {
	return &catalog{upstream: strings.TrimRight(upstream, "/"), client: &http.Client{Timeout: 10 * time.Second}}
}

// refresh re-reads /api/tags and each model's capabilities.
func (c *catalog) refresh() error {
	resp, err := c.client.Get(c.upstream + "/api/tags")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var tags struct {
		Models []struct {
			Name        string `json:"name"`
			Model       string `json:"model"`
			RemoteModel string `json:"remote_model"`
			RemoteHost  string `json:"remote_host"`
		} `json:"models"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&tags); err != nil {
		return err
	}
	var models []installed
	for _, m := range tags.Models {
		raw := m.Model
		if raw == "" {
			raw = m.Name
		}
		n := parseName(raw)
		if !n.isValid() {
			continue
		}
		models = append(models, installed{name: n, caps: c.capabilities(raw), remote: m.RemoteModel != "" && m.RemoteHost != ""})
	}
	c.mu.Lock()
	c.models = models
	c.mu.Unlock()
	return nil
}

func (c *catalog) capabilities(name string) []string {
	body, _ := json.Marshal(map[string]string{"model": name})
	resp, err := c.client.Post(c.upstream+"/api/show", "application/json", bytes.NewReader(body))
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var show struct {
		Capabilities []string `json:"capabilities"`
	}
	if json.NewDecoder(resp.Body).Decode(&show) != nil {
		return nil
	}
	return show.Capabilities
}

// find returns the installed model named exactly n, refreshing once on a miss
// so that a model pulled after start-up is seen.
func (c *catalog) find(n modelName, fold bool) (installed, bool) {
	if m, ok := c.lookup(n, fold); ok {
		return m, true
	}
	if c.refresh() != nil {
		return installed{}, false
	}
	return c.lookup(n, fold)
}

func (c *catalog) lookup(n modelName, fold bool) (installed, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	candidates := []modelName{n}
	if fold {
		candidates = foldName(n, c.models)
	}
	for _, cand := range candidates {
		for _, m := range c.models {
			if m.name == cand {
				return m, true
			}
		}
	}
	return installed{}, false
}

// foldName follows server/routes.go getExistingName: each part of the name is
// replaced by a manifest's part that equals it case-insensitively. Ollama
// takes whichever manifest its directory walk yields last, so when manifests
// differ only in case every combination is returned.
func foldName(n modelName, models []installed) []modelName {
	parts := [4][]string{}
	own := [4]string{n.Host, n.Namespace, n.Model, n.Tag}
	for i := range parts {
		seen := map[string]bool{}
		for _, m := range models {
			p := [4]string{m.name.Host, m.name.Namespace, m.name.Model, m.name.Tag}[i]
			if strings.EqualFold(p, own[i]) && !seen[p] {
				seen[p] = true
				parts[i] = append(parts[i], p)
			}
		}
		if len(parts[i]) == 0 {
			parts[i] = []string{own[i]}
		}
	}
	var out []modelName
	for _, h := range parts[0] {
		for _, ns := range parts[1] {
			for _, m := range parts[2] {
				for _, t := range parts[3] {
					out = append(out, modelName{h, ns, m, t})
				}
			}
		}
	}
	return out
}
