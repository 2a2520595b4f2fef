//go:build !external_default_model

package models

import _ "embed"

//go:embed default/trigon-go.q8_0.gguf
var defaultGGUF []byte

func defaultBytes() ([]byte, error) { return defaultGGUF, nil }
