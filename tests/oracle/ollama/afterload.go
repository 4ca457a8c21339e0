package main

// What Ollama v0.24.0 refuses only after the model is loaded: GenerateHandler
// parses the request's own template once scheduleRunner has returned a runner
// (server/routes.go, `template.Parse(req.Template)`, answered 500), and
// llmServer.Completion refuses a format it cannot use before it asks the
// runner anything (llm/server.go Completion, also a 500).

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/template"
	"text/template/parse"
)

// generateAfterLoad is GenerateHandler from the load to the runner's
// Completion, for a request with a prompt: its template (unless raw), then
// its format. A template that parses but fails to execute is not judged.
func generateAfterLoad(req GenerateRequest) string {
	if !req.Raw && req.Template != "" {
		if err := parseTemplate(req.Template); err != nil {
			return err.Error()
		}
	}
	return formatRefusal(req.Format)
}

// formatRefusal is the head of llm/server.go llmServer.Completion: a format
// given as null or "" is none, "json" is JSON; anything else must be a JSON
// schema object (whose grammar llama.cpp then builds: not judged here).
func formatRefusal(format json.RawMessage) string {
	if len(format) == 0 {
		return ""
	}
	switch string(format) {
	case `null`, `""`, `"json"`:
		return ""
	}
	if format[0] != '{' {
		return fmt.Sprintf("invalid format: %q; expected \"json\" or a valid JSON Schema object", format)
	}
	return ""
}

// templateFuncs are template/template.go funcs: only their names matter to the
// parser ("function %q not defined").
var templateFuncs = template.FuncMap{
	"json":             func(v any) string { return "" },
	"currentDate":      func(args ...string) string { return "" },
	"yesterdayDate":    func(args ...string) string { return "" },
	"toTypeScriptType": func(v any) string { return "" },
}

// parseTemplate is template/template.go Parse: text/template with the
// missingkey=zero option and Ollama's funcs, then Template.Vars.
func parseTemplate(s string) error {
	tmpl, err := template.New("").Option("missingkey=zero").Funcs(templateFuncs).Parse(s)
	if err != nil {
		return err
	}
	for _, tt := range tmpl.Templates() {
		for _, n := range tt.Root.Nodes {
			if err := identifiers(n); err != nil {
				return err
			}
		}
	}
	return nil
}

// identifiers is template/template.go Identifiers, keeping only its errors.
func identifiers(n parse.Node) error {
	switch n := n.(type) {
	case *parse.ListNode:
		for _, c := range n.Nodes {
			if err := identifiers(c); err != nil {
				return err
			}
		}
	case *parse.TemplateNode:
		if n.Pipe == nil {
			return errors.New("undefined template specified")
		}
		return identifiers(n.Pipe)
	case *parse.ActionNode:
		if n.Pipe == nil {
			return errors.New("undefined action in template")
		}
		return identifiers(n.Pipe)
	case *parse.BranchNode:
		return branchIdentifiers(n)
	case *parse.IfNode:
		return branchIdentifiers(&n.BranchNode)
	case *parse.RangeNode:
		return branchIdentifiers(&n.BranchNode)
	case *parse.WithNode:
		return branchIdentifiers(&n.BranchNode)
	case *parse.PipeNode:
		for _, c := range n.Cmds {
			for _, a := range c.Args {
				if err := identifiers(a); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func branchIdentifiers(n *parse.BranchNode) error {
	if n.Pipe == nil {
		return errors.New("undefined branch")
	}
	if err := identifiers(n.Pipe); err != nil {
		return err
	}
	for _, l := range []*parse.ListNode{n.List, n.ElseList} {
		if l != nil {
			if err := identifiers(l); err != nil {
				return err
			}
		}
	}
	return nil
}

// templateErrors answers -check-templates: each line of in is a JSON string,
// each line written is the JSON string of its parseTemplate error ("" if none).
func templateErrors(in io.Reader, out io.Writer) error {
	scanner := bufio.NewScanner(in)
	scanner.Buffer(make([]byte, 1<<20), 1<<26)
	writer := bufio.NewWriter(out)
	for scanner.Scan() {
		var text string
		if err := json.Unmarshal(scanner.Bytes(), &text); err != nil {
			return err
		}
		message := ""
		if err := parseTemplate(text); err != nil {
			message = err.Error()
		}
		line, err := json.Marshal(message)
		if err != nil {
			return err
		}
		writer.Write(append(line, '\n'))
	}
	if err := scanner.Err(); err != nil {
		return err
	}
	return writer.Flush()
}
