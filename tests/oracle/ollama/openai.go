package main

// The /v1 request types and their conversions to api requests, from Ollama
// v0.24.0 openai/openai.go and openai/responses.go, trimmed to what can refuse
// a request or changes what the handler then reads.

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// oaMessage is openai/openai.go Message.
type oaMessage struct {
	Role       string       `json:"role"`
	Content    any          `json:"content"`
	Reasoning  string       `json:"reasoning,omitempty"`
	ToolCalls  []oaToolCall `json:"tool_calls,omitempty"`
	Name       string       `json:"name,omitempty"`
	ToolCallID string       `json:"tool_call_id,omitempty"`
}

// oaToolCall is openai/openai.go ToolCall.
type oaToolCall struct {
	ID       string `json:"id"`
	Index    int    `json:"index"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// oaResponseFormat is openai/openai.go ResponseFormat.
type oaResponseFormat struct {
	Type       string `json:"type"`
	JSONSchema *struct {
		Schema json.RawMessage `json:"schema"`
	} `json:"json_schema,omitempty"`
}

// oaChatCompletionRequest is openai/openai.go ChatCompletionRequest.
type oaChatCompletionRequest struct {
	Model         string      `json:"model"`
	Messages      []oaMessage `json:"messages"`
	Stream        bool        `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	MaxTokens        *int              `json:"max_tokens"`
	Seed             *int              `json:"seed"`
	Stop             any               `json:"stop"`
	Temperature      *float64          `json:"temperature"`
	FrequencyPenalty *float64          `json:"frequency_penalty"`
	PresencePenalty  *float64          `json:"presence_penalty"`
	TopP             *float64          `json:"top_p"`
	ResponseFormat   *oaResponseFormat `json:"response_format"`
	Tools            []Tool            `json:"tools"`
	Reasoning        *struct {
		Effort string `json:"effort,omitempty"`
	} `json:"reasoning,omitempty"`
	ReasoningEffort *string `json:"reasoning_effort,omitempty"`
	Logprobs        *bool   `json:"logprobs"`
	TopLogprobs     int     `json:"top_logprobs"`
	DebugRenderOnly bool    `json:"_debug_render_only"`
}

// oaCompletionRequest is openai/openai.go CompletionRequest.
type oaCompletionRequest struct {
	Model            string  `json:"model"`
	Prompt           string  `json:"prompt"`
	FrequencyPenalty float32 `json:"frequency_penalty"`
	MaxTokens        *int    `json:"max_tokens"`
	PresencePenalty  float32 `json:"presence_penalty"`
	Seed             *int    `json:"seed"`
	Stop             any     `json:"stop"`
	Stream           bool    `json:"stream"`
	StreamOptions    *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Temperature     *float32 `json:"temperature"`
	TopP            float32  `json:"top_p"`
	Suffix          string   `json:"suffix"`
	Logprobs        *int     `json:"logprobs"`
	DebugRenderOnly bool     `json:"_debug_render_only"`
}

// oaEmbedRequest is openai/openai.go EmbedRequest.
type oaEmbedRequest struct {
	Input          any    `json:"input"`
	Model          string `json:"model"`
	Dimensions     int    `json:"dimensions,omitempty"`
	EncodingFormat string `json:"encoding_format,omitempty"`
}

// fromChatRequest is openai/openai.go FromChatRequest, keeping its refusals
// and the fields the chat handler reads.
func fromChatRequest(r oaChatCompletionRequest) (*ChatRequest, error) {
	var messages []Message
	for _, msg := range r.Messages {
		switch content := msg.Content.(type) {
		case string:
			toolCalls, err := fromCompletionToolCall(msg.ToolCalls)
			if err != nil {
				return nil, err
			}
			messages = append(messages, Message{Role: msg.Role, Content: content, ToolCalls: toolCalls})
		case []any:
			for _, c := range content {
				data, ok := c.(map[string]any)
				if !ok {
					return nil, errors.New("invalid message format")
				}
				switch data["type"] {
				case "text":
					text, ok := data["text"].(string)
					if !ok {
						return nil, errors.New("invalid message format")
					}
					messages = append(messages, Message{Role: msg.Role, Content: text})
				case "image_url":
					var url string
					if urlMap, ok := data["image_url"].(map[string]any); ok {
						if url, ok = urlMap["url"].(string); !ok {
							return nil, errors.New("invalid message format")
						}
					} else if url, ok = data["image_url"].(string); !ok {
						return nil, errors.New("invalid message format")
					}
					img, err := decodeImageURL(url)
					if err != nil {
						return nil, err
					}
					messages = append(messages, Message{Role: msg.Role, Images: []ImageData{img}})
				case "input_audio":
					audioMap, ok := data["input_audio"].(map[string]any)
					if !ok {
						return nil, errors.New("invalid input_audio format")
					}
					b64Data, ok := audioMap["data"].(string)
					if !ok {
						return nil, errors.New("invalid input_audio format: missing data")
					}
					audio, err := base64.StdEncoding.DecodeString(b64Data)
					if err != nil {
						return nil, fmt.Errorf("invalid input_audio base64 data: %w", err)
					}
					messages = append(messages, Message{Role: msg.Role, Images: []ImageData{audio}})
				default:
					return nil, errors.New("invalid message format")
				}
			}
			if len(messages) > 0 && len(msg.ToolCalls) > 0 {
				toolCalls, err := fromCompletionToolCall(msg.ToolCalls)
				if err != nil {
					return nil, err
				}
				messages[len(messages)-1].ToolCalls = toolCalls
			}
		default:
			if msg.ToolCalls == nil {
				return nil, fmt.Errorf("invalid message content type: %T", content)
			}
			toolCalls, err := fromCompletionToolCall(msg.ToolCalls)
			if err != nil {
				return nil, err
			}
			messages = append(messages, Message{Role: msg.Role, ToolCalls: toolCalls})
		}
	}

	options := map[string]any{"temperature": 1.0, "top_p": 1.0}
	switch stop := r.Stop.(type) {
	case string:
		options["stop"] = []string{stop}
	case []any:
		var stops []string
		for _, s := range stop {
			if str, ok := s.(string); ok {
				stops = append(stops, str)
			}
		}
		options["stop"] = stops
	}
	if r.MaxTokens != nil {
		options["num_predict"] = *r.MaxTokens
	}
	if r.Temperature != nil {
		options["temperature"] = *r.Temperature
	}
	if r.Seed != nil {
		options["seed"] = *r.Seed
	}
	if r.FrequencyPenalty != nil {
		options["frequency_penalty"] = *r.FrequencyPenalty
	}
	if r.PresencePenalty != nil {
		options["presence_penalty"] = *r.PresencePenalty
	}
	if r.TopP != nil {
		options["top_p"] = *r.TopP
	}

	var think *ThinkValue
	var effort string
	if r.Reasoning != nil {
		effort = r.Reasoning.Effort
	} else if r.ReasoningEffort != nil {
		effort = *r.ReasoningEffort
	}
	if effort != "" {
		if !slices.Contains([]string{"high", "medium", "low", "max", "none"}, effort) {
			return nil, fmt.Errorf("invalid reasoning value: '%s' (must be \"high\", \"medium\", \"low\", \"max\", or \"none\")", effort)
		}
		if effort == "none" {
			think = &ThinkValue{Value: false}
		} else {
			think = &ThinkValue{Value: effort}
		}
	}
	return &ChatRequest{
		Model:       r.Model,
		Messages:    messages,
		Options:     options,
		Stream:      &r.Stream,
		Tools:       r.Tools,
		Think:       think,
		Logprobs:    r.Logprobs != nil && *r.Logprobs,
		TopLogprobs: r.TopLogprobs,
	}, nil
}

// decodeImageURL is openai/openai.go decodeImageURL.
func decodeImageURL(url string) (ImageData, error) {
	if strings.HasPrefix(url, "http://") || strings.HasPrefix(url, "https://") {
		return nil, errors.New("image URLs are not currently supported, please use base64 encoded data instead")
	}
	if strings.HasPrefix(url, "data:;base64,") {
		url = strings.TrimPrefix(url, "data:;base64,")
	} else {
		valid := false
		for _, t := range []string{"jpeg", "jpg", "png", "webp"} {
			prefix := "data:image/" + t + ";base64,"
			if strings.HasPrefix(url, prefix) {
				url = strings.TrimPrefix(url, prefix)
				valid = true
				break
			}
		}
		if !valid {
			return nil, errors.New("invalid image input")
		}
	}
	img, err := base64.StdEncoding.DecodeString(url)
	if err != nil {
		return nil, errors.New("invalid image input")
	}
	return img, nil
}

// fromCompletionToolCall is openai/openai.go FromCompletionToolCall: the
// arguments string must itself decode as a JSON object (or null).
func fromCompletionToolCall(toolCalls []oaToolCall) ([]ToolCall, error) {
	out := make([]ToolCall, len(toolCalls))
	for i, tc := range toolCalls {
		out[i].ID = tc.ID
		out[i].Function.Name = tc.Function.Name
		if err := json.Unmarshal([]byte(tc.Function.Arguments), &out[i].Function.Arguments); err != nil {
			return nil, errors.New("invalid tool call arguments")
		}
	}
	return out, nil
}

// fromCompleteRequest is openai/openai.go FromCompleteRequest.
func fromCompleteRequest(r oaCompletionRequest) (GenerateRequest, error) {
	options := map[string]any{"temperature": 1.0, "top_p": 1.0}
	switch stop := r.Stop.(type) {
	case string:
		options["stop"] = []string{stop}
	case []any:
		var stops []string
		for _, s := range stop {
			str, ok := s.(string)
			if !ok {
				return GenerateRequest{}, fmt.Errorf("invalid type for 'stop' field: %T", s)
			}
			stops = append(stops, str)
		}
		options["stop"] = stops
	}
	if r.MaxTokens != nil {
		options["num_predict"] = *r.MaxTokens
	}
	if r.Temperature != nil {
		options["temperature"] = *r.Temperature
	}
	if r.Seed != nil {
		options["seed"] = *r.Seed
	}
	options["frequency_penalty"] = r.FrequencyPenalty
	options["presence_penalty"] = r.PresencePenalty
	if r.TopP != 0.0 {
		options["top_p"] = r.TopP
	}
	var logprobs bool
	var topLogprobs int
	if r.Logprobs != nil && *r.Logprobs > 0 {
		logprobs = true
		topLogprobs = *r.Logprobs
	}
	return GenerateRequest{
		Model:       r.Model,
		Prompt:      r.Prompt,
		Options:     options,
		Stream:      &r.Stream,
		Suffix:      r.Suffix,
		Logprobs:    logprobs,
		TopLogprobs: topLogprobs,
	}, nil
}

// The Responses API (openai/responses.go).

type responsesContent any

// rsTextContent is openai/responses.go ResponsesTextContent (also used for
// ResponsesOutputTextContent, which has the same fields).
type rsTextContent struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// rsImageContent is openai/responses.go ResponsesImageContent.
type rsImageContent struct {
	Type     string `json:"type"`
	Detail   string `json:"detail"`
	FileID   string `json:"file_id,omitempty"`
	ImageURL string `json:"image_url,omitempty"`
}

// rsFileContent is openai/responses.go ResponsesFileContent.
type rsFileContent struct {
	Type     string `json:"type"`
	FileData string `json:"file_data,omitempty"`
	FileID   string `json:"file_id,omitempty"`
	FileURL  string `json:"file_url,omitempty"`
	Filename string `json:"filename,omitempty"`
}

// rsInputMessage is openai/responses.go ResponsesInputMessage.
type rsInputMessage struct {
	Type    string
	Role    string
	Content []responsesContent
}

// UnmarshalJSON is openai/responses.go ResponsesInputMessage.UnmarshalJSON.
func (m *rsInputMessage) UnmarshalJSON(data []byte) error {
	var aux struct {
		Type    string          `json:"type"`
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(data, &aux); err != nil {
		return err
	}
	m.Type, m.Role = aux.Type, aux.Role
	if len(aux.Content) == 0 {
		return nil
	}
	var contentStr string
	if err := json.Unmarshal(aux.Content, &contentStr); err == nil {
		m.Content = []responsesContent{rsTextContent{Type: "input_text", Text: contentStr}}
		return nil
	}
	var rawItems []json.RawMessage
	if err := json.Unmarshal(aux.Content, &rawItems); err != nil {
		return fmt.Errorf("content must be a string or array: %w", err)
	}
	for i, raw := range rawItems {
		content, err := unmarshalResponsesContent(raw)
		if err != nil {
			return fmt.Errorf("content[%d]: %w", i, err)
		}
		m.Content = append(m.Content, content)
	}
	return nil
}

// unmarshalResponsesContent is openai/responses.go unmarshalResponsesContent.
func unmarshalResponsesContent(data []byte) (responsesContent, error) {
	var typeField struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(data, &typeField); err != nil {
		return nil, err
	}
	switch typeField.Type {
	case "input_text", "output_text":
		var content rsTextContent
		err := json.Unmarshal(data, &content)
		return content, err
	case "input_image":
		var content rsImageContent
		err := json.Unmarshal(data, &content)
		return content, err
	case "input_file":
		var content rsFileContent
		err := json.Unmarshal(data, &content)
		return content, err
	default:
		return nil, fmt.Errorf("unknown content type: %s", typeField.Type)
	}
}

// rsFunctionCall is openai/responses.go ResponsesFunctionCall.
type rsFunctionCall struct {
	ID        string `json:"id,omitempty"`
	Type      string `json:"type"`
	CallID    string `json:"call_id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// rsFunctionCallOutput is openai/responses.go ResponsesFunctionCallOutput.
type rsFunctionCallOutput struct {
	Type        string
	CallID      string
	Output      string
	OutputItems []responsesContent
}

// UnmarshalJSON is openai/responses.go ResponsesFunctionCallOutput.UnmarshalJSON.
func (o *rsFunctionCallOutput) UnmarshalJSON(data []byte) error {
	var aux struct {
		Type   string          `json:"type"`
		CallID string          `json:"call_id"`
		Output json.RawMessage `json:"output"`
	}
	if err := json.Unmarshal(data, &aux); err != nil {
		return err
	}
	o.Type, o.CallID, o.Output, o.OutputItems = aux.Type, aux.CallID, "", nil
	if len(aux.Output) == 0 {
		return nil
	}
	var output string
	if err := json.Unmarshal(aux.Output, &output); err == nil {
		o.Output = output
		return nil
	}
	var rawItems []json.RawMessage
	if err := json.Unmarshal(aux.Output, &rawItems); err != nil {
		return fmt.Errorf("output must be a string or array: %w", err)
	}
	for i, raw := range rawItems {
		content, err := unmarshalResponsesContent(raw)
		if err != nil {
			return fmt.Errorf("output[%d]: %w", i, err)
		}
		o.OutputItems = append(o.OutputItems, content)
	}
	return nil
}

// rsReasoningInput is openai/responses.go ResponsesReasoningInput.
type rsReasoningInput struct {
	ID      string `json:"id,omitempty"`
	Type    string `json:"type"`
	Summary []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"summary,omitempty"`
	EncryptedContent string `json:"encrypted_content,omitempty"`
}

// unmarshalResponsesInputItem is openai/responses.go unmarshalResponsesInputItem.
func unmarshalResponsesInputItem(data []byte) (any, error) {
	var typeField struct {
		Type string `json:"type"`
		Role string `json:"role"`
	}
	if err := json.Unmarshal(data, &typeField); err != nil {
		return nil, err
	}
	itemType := typeField.Type
	if itemType == "" && typeField.Role != "" {
		itemType = "message"
	}
	switch itemType {
	case "message":
		var msg rsInputMessage
		err := json.Unmarshal(data, &msg)
		return msg, err
	case "function_call":
		var fc rsFunctionCall
		err := json.Unmarshal(data, &fc)
		return fc, err
	case "function_call_output":
		var out rsFunctionCallOutput
		err := json.Unmarshal(data, &out)
		return out, err
	case "reasoning":
		var r rsReasoningInput
		err := json.Unmarshal(data, &r)
		return r, err
	case "":
		return nil, fmt.Errorf("input item missing required 'type' field")
	default:
		return nil, fmt.Errorf("unknown input item type: %q", itemType)
	}
}

// rsInput is openai/responses.go ResponsesInput.
type rsInput struct {
	Text  string
	Items []any
}

// UnmarshalJSON is openai/responses.go ResponsesInput.UnmarshalJSON.
func (r *rsInput) UnmarshalJSON(data []byte) error {
	var s string
	if err := json.Unmarshal(data, &s); err == nil {
		r.Text = s
		return nil
	}
	var rawItems []json.RawMessage
	if err := json.Unmarshal(data, &rawItems); err != nil {
		return fmt.Errorf("input must be a string or array: %w", err)
	}
	for i, raw := range rawItems {
		item, err := unmarshalResponsesInputItem(raw)
		if err != nil {
			return fmt.Errorf("input[%d]: %w", i, err)
		}
		r.Items = append(r.Items, item)
	}
	return nil
}

// rsTool is openai/responses.go ResponsesTool.
type rsTool struct {
	Type        string         `json:"type"`
	Name        string         `json:"name"`
	Description *string        `json:"description"`
	Strict      *bool          `json:"strict"`
	Parameters  map[string]any `json:"parameters"`
}

// rsRequest is openai/responses.go ResponsesRequest.
type rsRequest struct {
	Model        string          `json:"model"`
	Background   bool            `json:"background"`
	Conversation json.RawMessage `json:"conversation"`
	Include      []string        `json:"include"`
	Input        rsInput         `json:"input"`
	Instructions string          `json:"instructions,omitempty"`
	MaxOutput    *int            `json:"max_output_tokens,omitempty"`
	Reasoning    struct {
		Effort          string `json:"effort,omitempty"`
		GenerateSummary string `json:"generate_summary,omitempty"`
		Summary         string `json:"summary,omitempty"`
	} `json:"reasoning"`
	Temperature *float64 `json:"temperature"`
	Text        *struct {
		Format *struct {
			Type   string          `json:"type"`
			Name   string          `json:"name,omitempty"`
			Schema json.RawMessage `json:"schema,omitempty"`
			Strict *bool           `json:"strict,omitempty"`
		} `json:"format,omitempty"`
	} `json:"text,omitempty"`
	TopP       *float64 `json:"top_p"`
	Truncation *string  `json:"truncation"`
	Tools      []rsTool `json:"tools,omitempty"`
	Stream     *bool    `json:"stream,omitempty"`
}

// fromResponsesRequest is openai/responses.go FromResponsesRequest, keeping
// its refusals and the fields the chat handler reads.
func fromResponsesRequest(r rsRequest) (*ChatRequest, error) {
	var messages []Message
	if r.Instructions != "" {
		messages = append(messages, Message{Role: "system", Content: r.Instructions})
	}
	if r.Input.Text != "" {
		messages = append(messages, Message{Role: "user", Content: r.Input.Text})
	}
	pendingThinking := ""
	for _, item := range r.Input.Items {
		switch v := item.(type) {
		case rsReasoningInput:
			pendingThinking = v.EncryptedContent
		case rsInputMessage:
			content, images, err := convertResponsesContent(v.Content)
			if err != nil {
				return nil, err
			}
			messages = append(messages, Message{Role: v.Role, Content: content, Images: images})
			if v.Role == "assistant" {
				pendingThinking = ""
			}
		case rsFunctionCall:
			var args ToolCallFunctionArguments
			if v.Arguments != "" {
				if err := json.Unmarshal([]byte(v.Arguments), &args); err != nil {
					return nil, fmt.Errorf("failed to parse function call arguments: %w", err)
				}
			}
			call := ToolCall{ID: v.CallID, Function: ToolCallFunction{Name: v.Name, Arguments: args}}
			if len(messages) > 0 && messages[len(messages)-1].Role == "assistant" {
				last := &messages[len(messages)-1]
				last.ToolCalls = append(last.ToolCalls, call)
			} else {
				messages = append(messages, Message{Role: "assistant", ToolCalls: []ToolCall{call}})
			}
			pendingThinking = ""
		case rsFunctionCallOutput:
			content := v.Output
			var images []ImageData
			if len(v.OutputItems) > 0 {
				var err error
				if content, images, err = convertResponsesContent(v.OutputItems); err != nil {
					return nil, err
				}
			}
			messages = append(messages, Message{Role: "tool", Content: content, Images: images, ToolCallID: v.CallID})
		}
	}
	if pendingThinking != "" {
		messages = append(messages, Message{Role: "assistant", Thinking: pendingThinking})
	}

	options := map[string]any{"temperature": 1.0}
	if r.Temperature != nil {
		options["temperature"] = *r.Temperature
	}
	if r.TopP != nil {
		options["top_p"] = *r.TopP
	}
	if r.MaxOutput != nil {
		options["num_predict"] = *r.MaxOutput
	}
	var think *ThinkValue
	if effort := r.Reasoning.Effort; effort != "" {
		switch effort {
		case "none":
			think = &ThinkValue{Value: false}
		case "low", "medium", "high", "max":
			think = &ThinkValue{Value: effort}
		default:
			return nil, fmt.Errorf("invalid reasoning value: %q (must be \"high\", \"medium\", \"low\", \"max\", or \"none\")", effort)
		}
	}
	var tools []Tool
	for _, t := range r.Tools {
		var params ToolFunctionParameters
		if t.Parameters != nil {
			b, err := json.Marshal(t.Parameters)
			if err != nil {
				return nil, fmt.Errorf("failed to marshal tool parameters: %w", err)
			}
			if err := json.Unmarshal(b, &params); err != nil {
				return nil, fmt.Errorf("failed to unmarshal tool parameters: %w", err)
			}
		}
		tools = append(tools, Tool{Type: t.Type, Function: ToolFunction{Name: t.Name, Parameters: params}})
	}
	return &ChatRequest{Model: r.Model, Messages: messages, Options: options, Tools: tools, Think: think}, nil
}

// convertResponsesContent is openai/responses.go convertResponsesContent.
func convertResponsesContent(contents []responsesContent) (string, []ImageData, error) {
	var content string
	var images []ImageData
	for _, c := range contents {
		switch v := c.(type) {
		case rsTextContent:
			content += v.Text
		case rsImageContent:
			if v.ImageURL == "" {
				continue
			}
			img, err := decodeImageURL(v.ImageURL)
			if err != nil {
				return "", nil, err
			}
			images = append(images, img)
		case rsFileContent:
			return "", nil, fmt.Errorf("file inputs are not currently supported")
		}
	}
	return content, images, nil
}
