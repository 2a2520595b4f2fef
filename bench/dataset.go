package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// maxDatasetLine bounds one line of a custom dataset file (one prompt).
const maxDatasetLine = 16 << 20

// LoadCustomDataset reads the prompts of a custom dataset file, vLLM's
// `--dataset-name custom` format: JSON Lines, one object a line with a
// string field "prompt" (other fields are ignored, blank lines skipped).
func LoadCustomDataset(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("dataset: %w", err)
	}
	defer f.Close()
	prompts, err := ParseCustomDataset(f)
	if err != nil {
		return nil, fmt.Errorf("dataset %s: %w", path, err)
	}
	return prompts, nil
}

// ParseCustomDataset reads LoadCustomDataset's format from r.
func ParseCustomDataset(r io.Reader) ([]string, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxDatasetLine)
	var prompts []string
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var row struct {
			Prompt *string `json:"prompt"`
		}
		if err := json.Unmarshal(line, &row); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		if row.Prompt == nil {
			return nil, fmt.Errorf("line %d: no string field \"prompt\"", n)
		}
		if *row.Prompt == "" {
			return nil, fmt.Errorf("line %d: empty prompt", n)
		}
		prompts = append(prompts, *row.Prompt)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read: %w", err)
	}
	if len(prompts) == 0 {
		return nil, errors.New("no prompts")
	}
	return prompts, nil
}
