package main

import (
	"os"
	"strings"
	"testing"
)

// TestREADMEShowsThisProgram: the README's "Run your own code" shows this
// program as it is.
func TestREADMEShowsThisProgram(t *testing.T) {
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	program := string(src[strings.Index(string(src), "package main"):])
	if !strings.Contains(string(readme), "```go\n"+program+"```") {
		t.Error("README.md's example worker differs from examples/worker/main.go: copy the program from `package main` on")
	}
}
