package main

// The /v1/messages request and its conversion, from Ollama v0.24.0
// anthropic/anthropic.go, trimmed to what can refuse a request or changes
// what the chat handler then reads.

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// anMessagesRequest is anthropic/anthropic.go MessagesRequest.
type anMessagesRequest struct {
	Model         string           `json:"model"`
	MaxTokens     int              `json:"max_tokens"`
	Messages      []anMessageParam `json:"messages"`
	System        any              `json:"system,omitempty"`
	Stream        bool             `json:"stream,omitempty"`
	Temperature   *float64         `json:"temperature,omitempty"`
	TopP          *float64         `json:"top_p,omitempty"`
	TopK          *int             `json:"top_k,omitempty"`
	StopSequences []string         `json:"stop_sequences,omitempty"`
	Tools         []anTool         `json:"tools,omitempty"`
	ToolChoice    *struct {
		Type                   string `json:"type"`
		Name                   string `json:"name,omitempty"`
		DisableParallelToolUse bool   `json:"disable_parallel_tool_use,omitempty"`
	} `json:"tool_choice,omitempty"`
	Thinking *struct {
		Type         string `json:"type"`
		BudgetTokens int    `json:"budget_tokens,omitempty"`
	} `json:"thinking,omitempty"`
	Metadata *struct {
		UserID string `json:"user_id,omitempty"`
	} `json:"metadata,omitempty"`
	OutputConfig *struct {
		Effort string `json:"effort,omitempty"`
	} `json:"output_config,omitempty"`
}

// anMessageParam is anthropic/anthropic.go MessageParam.
type anMessageParam struct {
	Role    string
	Content []anContentBlock
}

// UnmarshalJSON is anthropic/anthropic.go MessageParam.UnmarshalJSON: a
// missing content is decoded from empty input, which is an error.
func (m *anMessageParam) UnmarshalJSON(data []byte) error {
	var raw struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return err
	}
	m.Role = raw.Role
	var s string
	if err := json.Unmarshal(raw.Content, &s); err == nil {
		m.Content = []anContentBlock{{Type: "text", Text: &s}}
		return nil
	}
	return json.Unmarshal(raw.Content, &m.Content)
}

// anContentBlock is anthropic/anthropic.go ContentBlock.
type anContentBlock struct {
	Type      string  `json:"type"`
	Text      *string `json:"text,omitempty"`
	Citations []struct {
		Type           string `json:"type"`
		URL            string `json:"url"`
		Title          string `json:"title"`
		EncryptedIndex string `json:"encrypted_index,omitempty"`
		CitedText      string `json:"cited_text,omitempty"`
	} `json:"citations,omitempty"`
	Source    *anImageSource            `json:"source,omitempty"`
	ID        string                    `json:"id,omitempty"`
	Name      string                    `json:"name,omitempty"`
	Input     ToolCallFunctionArguments `json:"input,omitzero"`
	ToolUseID string                    `json:"tool_use_id,omitempty"`
	Content   any                       `json:"content,omitempty"`
	IsError   bool                      `json:"is_error,omitempty"`
	Thinking  *string                   `json:"thinking,omitempty"`
	Signature string                    `json:"signature,omitempty"`
}

// anImageSource is anthropic/anthropic.go ImageSource.
type anImageSource struct {
	Type      string `json:"type"`
	MediaType string `json:"media_type,omitempty"`
	Data      string `json:"data,omitempty"`
	URL       string `json:"url,omitempty"`
}

// anTool is anthropic/anthropic.go Tool.
type anTool struct {
	Type        string          `json:"type,omitempty"`
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"input_schema,omitempty"`
	MaxUses     int             `json:"max_uses,omitempty"`
}

// fromMessagesRequest is anthropic/anthropic.go FromMessagesRequest.
func fromMessagesRequest(r anMessagesRequest) (*ChatRequest, error) {
	var messages []Message
	switch sys := r.System.(type) {
	case string:
		if sys != "" {
			messages = append(messages, Message{Role: "system", Content: sys})
		}
	case []any:
		var content strings.Builder
		for _, block := range sys {
			if m, ok := block.(map[string]any); ok && m["type"] == "text" {
				if text, ok := m["text"].(string); ok {
					content.WriteString(text)
				}
			}
		}
		if content.Len() > 0 {
			messages = append(messages, Message{Role: "system", Content: content.String()})
		}
	}
	for _, msg := range r.Messages {
		converted, err := convertAnthropicMessage(msg)
		if err != nil {
			return nil, err
		}
		messages = append(messages, converted...)
	}

	options := map[string]any{"num_predict": r.MaxTokens}
	if r.Temperature != nil {
		options["temperature"] = *r.Temperature
	}
	if r.TopP != nil {
		options["top_p"] = *r.TopP
	}
	if r.TopK != nil {
		options["top_k"] = *r.TopK
	}
	if len(r.StopSequences) > 0 {
		options["stop"] = r.StopSequences
	}

	hasBuiltinWebSearch := false
	for _, t := range r.Tools {
		if strings.HasPrefix(t.Type, "web_search") {
			hasBuiltinWebSearch = true
			break
		}
	}
	var tools Tools
	for _, t := range r.Tools {
		if strings.HasPrefix(t.Type, "web_search") {
			tools = append(tools, Tool{Type: "function", Function: ToolFunction{Name: "web_search"}})
			continue
		}
		if hasBuiltinWebSearch && t.Name == "web_search" {
			continue
		}
		var params ToolFunctionParameters
		if len(t.InputSchema) > 0 {
			if err := json.Unmarshal(t.InputSchema, &params); err != nil {
				return nil, fmt.Errorf("invalid input_schema for tool %q: %w", t.Name, err)
			}
		}
		tools = append(tools, Tool{Type: "function", Function: ToolFunction{Name: t.Name, Parameters: params}})
	}

	var think *ThinkValue
	effort := ""
	if r.OutputConfig != nil {
		effort = strings.ToLower(strings.TrimSpace(r.OutputConfig.Effort))
		if effort == "xhigh" {
			effort = "high"
		}
	}
	if r.Thinking != nil && r.Thinking.Type == "enabled" {
		think = &ThinkValue{Value: true}
	}
	if r.Thinking != nil && r.Thinking.Type == "disabled" {
		think = &ThinkValue{Value: false}
	}
	if think == nil && r.OutputConfig != nil {
		switch effort {
		case "high", "medium", "low", "max":
			think = &ThinkValue{Value: effort}
		}
	}
	stream := r.Stream
	return &ChatRequest{Model: r.Model, Messages: messages, Options: options, Stream: &stream, Tools: tools, Think: think}, nil
}

// convertAnthropicMessage is anthropic/anthropic.go convertMessage, keeping
// its refusals and whether it yields any message.
func convertAnthropicMessage(msg anMessageParam) ([]Message, error) {
	role := strings.ToLower(msg.Role)
	var text strings.Builder
	var images []ImageData
	var toolCalls []ToolCall
	var thinking string
	var toolResults []Message
	for _, block := range msg.Content {
		switch block.Type {
		case "text":
			if block.Text != nil {
				text.WriteString(*block.Text)
			}
		case "image":
			if block.Source == nil {
				return nil, errors.New("invalid image source")
			}
			decoded, err := resolveImageSource(block.Source)
			if err != nil {
				return nil, err
			}
			images = append(images, decoded)
		case "tool_use":
			if block.ID == "" {
				return nil, errors.New("tool_use block missing required 'id' field")
			}
			if block.Name == "" {
				return nil, errors.New("tool_use block missing required 'name' field")
			}
			toolCalls = append(toolCalls, ToolCall{ID: block.ID, Function: ToolCallFunction{Name: block.Name, Arguments: block.Input}})
		case "tool_result":
			content, imgs, err := convertToolResultContent(block.Content)
			if err != nil {
				return nil, err
			}
			toolResults = append(toolResults, Message{Role: "tool", Content: content, Images: imgs, ToolCallID: block.ToolUseID})
		case "thinking":
			if block.Thinking != nil {
				thinking = *block.Thinking
			}
		case "server_tool_use":
			toolCalls = append(toolCalls, ToolCall{ID: block.ID, Function: ToolCallFunction{Name: block.Name, Arguments: block.Input}})
		case "web_search_tool_result":
			toolResults = append(toolResults, Message{Role: "tool", ToolCallID: block.ToolUseID})
		}
	}
	var messages []Message
	if role == "user" && len(toolResults) > 0 {
		messages = append(messages, toolResults...)
	}
	if text.Len() > 0 || len(images) > 0 || len(toolCalls) > 0 || thinking != "" {
		messages = append(messages, Message{Role: role, Content: text.String(), Images: images, ToolCalls: toolCalls, Thinking: thinking})
	}
	if role != "user" || len(toolResults) == 0 {
		messages = append(messages, toolResults...)
	}
	return messages, nil
}

// resolveImageSource is anthropic/anthropic.go resolveImageSource.
func resolveImageSource(source *anImageSource) (ImageData, error) {
	if source.Type != "base64" {
		return nil, fmt.Errorf("invalid image source type: %s. Only base64 images are supported.", source.Type)
	}
	decoded, err := base64.StdEncoding.DecodeString(source.Data)
	if err != nil {
		return nil, fmt.Errorf("invalid base64 image data: %w", err)
	}
	return decoded, nil
}

// convertToolResultContent is anthropic/anthropic.go convertToolResultContent.
func convertToolResultContent(content any) (string, []ImageData, error) {
	c, ok := content.([]any)
	if !ok {
		if s, ok := content.(string); ok {
			return s, nil, nil
		}
		return "", nil, nil
	}
	var text strings.Builder
	var images []ImageData
	for _, cb := range c {
		m, ok := cb.(map[string]any)
		if !ok {
			continue
		}
		switch m["type"] {
		case "text":
			if t, ok := m["text"].(string); ok {
				text.WriteString(t)
			}
		case "image":
			raw, ok := m["source"].(map[string]any)
			if !ok {
				return "", nil, errors.New("invalid tool_result image source")
			}
			var source anImageSource
			source.Type, _ = raw["type"].(string)
			source.Data, _ = raw["data"].(string)
			img, err := resolveImageSource(&source)
			if err != nil {
				return "", nil, err
			}
			images = append(images, img)
		}
	}
	return text.String(), images, nil
}
