// Renders an Ollama Modelfile's TEMPLATE with Go's text/template, the engine Ollama itself uses, over the values
// Ollama gives it: .System, .Prompt and .Messages (each .Role and .Content). Used by tests/after/test_gguf_export.py:
//
//	go run main.go TEMPLATE_FILE < values.json
package main

import (
	"encoding/json"
	"os"
	"text/template"
)

type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type Values struct {
	System   string    `json:"system"`
	Prompt   string    `json:"prompt"`
	Messages []Message `json:"messages"`
}

func main() {
	text, err := os.ReadFile(os.Args[1])
	if err != nil {
		panic(err)
	}
	var values Values
	if err := json.NewDecoder(os.Stdin).Decode(&values); err != nil {
		panic(err)
	}
	tmpl := template.Must(template.New("modelfile").Parse(string(text)))
	if err := tmpl.Execute(os.Stdout, values); err != nil {
		panic(err)
	}
}
