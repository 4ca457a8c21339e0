package main

// Request types of Ollama v0.24.0 api/types.go, trimmed to the fields and
// decode methods that decide whether a request is refused before it reaches
// the scheduler. Field order and json tags are kept: encoding/json matches
// keys to them case-insensitively, and the last duplicate key wins.

import (
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strings"
	"time"
)

// ImageData is api/types.go ImageData: base64 in a JSON string, or an array of bytes.
type ImageData []byte

// GenerateRequest is api/types.go GenerateRequest.
type GenerateRequest struct {
	Model           string          `json:"model"`
	Prompt          string          `json:"prompt"`
	Suffix          string          `json:"suffix"`
	System          string          `json:"system"`
	Template        string          `json:"template"`
	Context         []int           `json:"context,omitempty"`
	Stream          *bool           `json:"stream,omitempty"`
	Raw             bool            `json:"raw,omitempty"`
	Format          json.RawMessage `json:"format,omitempty"`
	KeepAlive       *Duration       `json:"keep_alive,omitempty"`
	Images          []ImageData     `json:"images,omitempty"`
	Options         map[string]any  `json:"options"`
	Think           *ThinkValue     `json:"think,omitempty"`
	Truncate        *bool           `json:"truncate,omitempty"`
	Shift           *bool           `json:"shift,omitempty"`
	DebugRenderOnly bool            `json:"_debug_render_only,omitempty"`
	Logprobs        bool            `json:"logprobs,omitempty"`
	TopLogprobs     int             `json:"top_logprobs,omitempty"`
	Width           int32           `json:"width,omitempty"`
	Height          int32           `json:"height,omitempty"`
	Steps           int32           `json:"steps,omitempty"`
}

// ChatRequest is api/types.go ChatRequest (Tools is embedded, as there).
type ChatRequest struct {
	Model           string          `json:"model"`
	Messages        []Message       `json:"messages"`
	Stream          *bool           `json:"stream,omitempty"`
	Format          json.RawMessage `json:"format,omitempty"`
	KeepAlive       *Duration       `json:"keep_alive,omitempty"`
	Tools           `json:"tools,omitempty"`
	Options         map[string]any `json:"options"`
	Think           *ThinkValue    `json:"think,omitempty"`
	Truncate        *bool          `json:"truncate,omitempty"`
	Shift           *bool          `json:"shift,omitempty"`
	DebugRenderOnly bool           `json:"_debug_render_only,omitempty"`
	Logprobs        bool           `json:"logprobs,omitempty"`
	TopLogprobs     int            `json:"top_logprobs,omitempty"`
}

// Tools is api/types.go Tools.
type Tools []Tool

// Message is api/types.go Message.
type Message struct {
	Role       string      `json:"role"`
	Content    string      `json:"content"`
	Thinking   string      `json:"thinking,omitempty"`
	Images     []ImageData `json:"images,omitempty"`
	ToolCalls  []ToolCall  `json:"tool_calls,omitempty"`
	ToolName   string      `json:"tool_name,omitempty"`
	ToolCallID string      `json:"tool_call_id,omitempty"`
}

// UnmarshalJSON is api/types.go Message.UnmarshalJSON.
func (m *Message) UnmarshalJSON(b []byte) error {
	type Alias Message
	var a Alias
	if err := json.Unmarshal(b, &a); err != nil {
		return err
	}
	*m = Message(a)
	m.Role = strings.ToLower(m.Role)
	return nil
}

// ToolCall is api/types.go ToolCall.
type ToolCall struct {
	ID       string           `json:"id,omitempty"`
	Function ToolCallFunction `json:"function"`
}

// ToolCallFunction is api/types.go ToolCallFunction.
type ToolCallFunction struct {
	Index     int                       `json:"index"`
	Name      string                    `json:"name"`
	Arguments ToolCallFunctionArguments `json:"arguments"`
}

// ToolCallFunctionArguments is api/types.go ToolCallFunctionArguments.
type ToolCallFunctionArguments struct {
	om *orderedMap[any]
}

// UnmarshalJSON is api/types.go ToolCallFunctionArguments.UnmarshalJSON.
func (t *ToolCallFunctionArguments) UnmarshalJSON(data []byte) error {
	t.om = &orderedMap[any]{}
	return json.Unmarshal(data, t.om)
}

// MarshalJSON is api/types.go ToolCallFunctionArguments.MarshalJSON.
func (t ToolCallFunctionArguments) MarshalJSON() ([]byte, error) {
	if t.om == nil {
		return []byte("{}"), nil
	}
	if t.om.empty() {
		return []byte("null"), nil
	}
	return t.om.MarshalJSON()
}

// Tool is api/types.go Tool.
type Tool struct {
	Type     string       `json:"type"`
	Items    any          `json:"items,omitempty"`
	Function ToolFunction `json:"function"`
}

// PropertyType is api/types.go PropertyType.
type PropertyType []string

// UnmarshalJSON is api/types.go PropertyType.UnmarshalJSON.
func (pt *PropertyType) UnmarshalJSON(data []byte) error {
	var s string
	if err := json.Unmarshal(data, &s); err == nil {
		*pt = []string{s}
		return nil
	}
	var a []string
	if err := json.Unmarshal(data, &a); err != nil {
		return err
	}
	*pt = a
	return nil
}

// MarshalJSON is api/types.go PropertyType.MarshalJSON.
func (pt PropertyType) MarshalJSON() ([]byte, error) {
	if len(pt) == 1 {
		return json.Marshal(pt[0])
	}
	return json.Marshal([]string(pt))
}

// ToolPropertiesMap is api/types.go ToolPropertiesMap.
type ToolPropertiesMap struct {
	om *orderedMap[ToolProperty]
}

// MarshalJSON is api/types.go ToolPropertiesMap.MarshalJSON.
func (t ToolPropertiesMap) MarshalJSON() ([]byte, error) {
	if t.om == nil || t.om.empty() {
		return []byte("null"), nil
	}
	return t.om.MarshalJSON()
}

// UnmarshalJSON is api/types.go ToolPropertiesMap.UnmarshalJSON.
func (t *ToolPropertiesMap) UnmarshalJSON(data []byte) error {
	t.om = &orderedMap[ToolProperty]{}
	return json.Unmarshal(data, t.om)
}

// ToolProperty is api/types.go ToolProperty.
type ToolProperty struct {
	AnyOf       []ToolProperty     `json:"anyOf,omitempty"`
	Type        PropertyType       `json:"type,omitempty"`
	Items       any                `json:"items,omitempty"`
	Description string             `json:"description,omitempty"`
	Enum        []any              `json:"enum,omitempty"`
	Properties  *ToolPropertiesMap `json:"properties,omitempty"`
	Required    []string           `json:"required,omitempty"`
}

// ToolFunctionParameters is api/types.go ToolFunctionParameters.
type ToolFunctionParameters struct {
	Type       string             `json:"type"`
	Defs       any                `json:"$defs,omitempty"`
	Items      any                `json:"items,omitempty"`
	Required   []string           `json:"required,omitempty"`
	Properties *ToolPropertiesMap `json:"properties"`
}

// ToolFunction is api/types.go ToolFunction.
type ToolFunction struct {
	Name        string                 `json:"name"`
	Description string                 `json:"description,omitempty"`
	Parameters  ToolFunctionParameters `json:"parameters"`
}

// EmbedRequest is api/types.go EmbedRequest.
type EmbedRequest struct {
	Model      string         `json:"model"`
	Input      any            `json:"input"`
	KeepAlive  *Duration      `json:"keep_alive,omitempty"`
	Truncate   *bool          `json:"truncate,omitempty"`
	Dimensions int            `json:"dimensions,omitempty"`
	Options    map[string]any `json:"options"`
}

// EmbeddingRequest is api/types.go EmbeddingRequest.
type EmbeddingRequest struct {
	Model     string         `json:"model"`
	Prompt    string         `json:"prompt"`
	KeepAlive *Duration      `json:"keep_alive,omitempty"`
	Options   map[string]any `json:"options"`
}

// Runner is api/types.go Runner: the load-time options.
type Runner struct {
	NumCtx    int   `json:"num_ctx,omitempty"`
	NumBatch  int   `json:"num_batch,omitempty"`
	NumGPU    int   `json:"num_gpu,omitempty"`
	MainGPU   int   `json:"main_gpu,omitempty"`
	UseMMap   *bool `json:"use_mmap,omitempty"`
	NumThread int   `json:"num_thread,omitempty"`
}

// Options is api/types.go Options; only its field kinds matter here, for FromMap.
type Options struct {
	Runner
	NumKeep          int      `json:"num_keep,omitempty"`
	Seed             int      `json:"seed,omitempty"`
	NumPredict       int      `json:"num_predict,omitempty"`
	TopK             int      `json:"top_k,omitempty"`
	TopP             float32  `json:"top_p,omitempty"`
	MinP             float32  `json:"min_p,omitempty"`
	TypicalP         float32  `json:"typical_p,omitempty"`
	RepeatLastN      int      `json:"repeat_last_n,omitempty"`
	Temperature      float32  `json:"temperature,omitempty"`
	RepeatPenalty    float32  `json:"repeat_penalty,omitempty"`
	PresencePenalty  float32  `json:"presence_penalty,omitempty"`
	FrequencyPenalty float32  `json:"frequency_penalty,omitempty"`
	Stop             []string `json:"stop,omitempty"`
}

// FromMap is api/types.go Options.FromMap: scheduleRunner calls it (through
// modelOptions) before asking the scheduler, so a mistyped option is a refusal.
func (opts *Options) FromMap(m map[string]any) error {
	valueOpts := reflect.ValueOf(opts).Elem()
	typeOpts := reflect.TypeOf(opts).Elem()
	jsonOpts := make(map[string]reflect.StructField)
	for _, field := range reflect.VisibleFields(typeOpts) {
		jsonTag := strings.Split(field.Tag.Get("json"), ",")[0]
		if jsonTag != "" {
			jsonOpts[jsonTag] = field
		}
	}
	for key, val := range m {
		opt, ok := jsonOpts[key]
		if !ok {
			continue
		}
		field := valueOpts.FieldByName(opt.Name)
		if !field.IsValid() || !field.CanSet() || val == nil {
			continue
		}
		switch field.Kind() {
		case reflect.Int:
			switch t := val.(type) {
			case int64:
				field.SetInt(t)
			case float64:
				field.SetInt(int64(t))
			default:
				return fmt.Errorf("option %q must be of type integer", key)
			}
		case reflect.Bool:
			if _, ok := val.(bool); !ok {
				return fmt.Errorf("option %q must be of type boolean", key)
			}
		case reflect.Float32:
			if _, ok := val.(float64); !ok {
				return fmt.Errorf("option %q must be of type float32", key)
			}
		case reflect.String:
			if _, ok := val.(string); !ok {
				return fmt.Errorf("option %q must be of type string", key)
			}
		case reflect.Slice:
			items, ok := val.([]any)
			if !ok {
				return fmt.Errorf("option %q must be of type array", key)
			}
			for _, item := range items {
				if _, ok := item.(string); !ok {
					return fmt.Errorf("option %q must be of an array of strings", key)
				}
			}
		case reflect.Pointer:
			if _, ok := val.(bool); !ok {
				return fmt.Errorf("option %q must be of type boolean", key)
			}
		default:
			return fmt.Errorf("unknown type loading config params: %v", field.Kind())
		}
	}
	return nil
}

// ThinkValue is api/types.go ThinkValue.
type ThinkValue struct {
	Value any
}

// Bool is api/types.go ThinkValue.Bool.
func (t *ThinkValue) Bool() bool {
	if t == nil || t.Value == nil {
		return false
	}
	switch v := t.Value.(type) {
	case bool:
		return v
	case string:
		return v == "high" || v == "medium" || v == "low" || v == "max"
	default:
		return false
	}
}

// UnmarshalJSON is api/types.go ThinkValue.UnmarshalJSON.
func (t *ThinkValue) UnmarshalJSON(data []byte) error {
	var b bool
	if err := json.Unmarshal(data, &b); err == nil {
		t.Value = b
		return nil
	}
	var s string
	if err := json.Unmarshal(data, &s); err == nil {
		if s != "high" && s != "medium" && s != "low" && s != "max" {
			return fmt.Errorf("invalid think value: %q (must be \"high\", \"medium\", \"low\", \"max\", true, or false)", s)
		}
		t.Value = s
		return nil
	}
	return fmt.Errorf("think must be a boolean or string (\"high\", \"medium\", \"low\", \"max\", true, or false)")
}

// MarshalJSON is api/types.go ThinkValue.MarshalJSON.
func (t *ThinkValue) MarshalJSON() ([]byte, error) {
	if t == nil || t.Value == nil {
		return []byte("null"), nil
	}
	return json.Marshal(t.Value)
}

// Duration is api/types.go Duration.
type Duration struct {
	time.Duration
}

// MarshalJSON is api/types.go Duration.MarshalJSON.
func (d Duration) MarshalJSON() ([]byte, error) {
	if d.Duration < 0 {
		return []byte("-1"), nil
	}
	return []byte("\"" + d.Duration.String() + "\""), nil
}

// UnmarshalJSON is api/types.go Duration.UnmarshalJSON: a number is seconds,
// a string goes through time.ParseDuration, anything negative is "forever".
func (d *Duration) UnmarshalJSON(b []byte) (err error) {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	d.Duration = 5 * time.Minute
	switch t := v.(type) {
	case float64:
		if t < 0 {
			d.Duration = time.Duration(math.MaxInt64)
		} else {
			d.Duration = time.Duration(t * float64(time.Second))
		}
	case string:
		d.Duration, err = time.ParseDuration(t)
		if err != nil {
			return err
		}
		if d.Duration < 0 {
			d.Duration = time.Duration(math.MaxInt64)
		}
	default:
		return fmt.Errorf("Unsupported type: '%s'", reflect.TypeOf(v))
	}
	return nil
}
