package safetensors

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
)

// File names of a Hugging Face model directory.
const (
	SingleFile = "model.safetensors"
	IndexFile  = "model.safetensors.index.json"
)

// maxIndexSize caps the index file read into memory; real ones are well
// under a megabyte per thousand tensors.
const maxIndexSize = 100 << 20

// Set is the tensors of a model directory, from one file or from shards.
type Set struct {
	files []*File
	where map[string]*File
	names []string // sorted
}

// OpenDir opens the weights of a Hugging Face model directory: the single
// file model.safetensors if present (as transformers prefers it), else the
// shards listed by model.safetensors.index.json, each opened once.
//
// For shards the index and the files must agree exactly: a tensor in a
// shard but absent from the weight_map, or mapped to a shard that lacks it,
// is an error, since either means the download is incomplete or mixed.
func OpenDir(dir string) (*Set, error) {
	single := filepath.Join(dir, SingleFile)
	if _, err := os.Stat(single); err == nil {
		f, err := Open(single)
		if err != nil {
			return nil, err
		}
		s := &Set{files: []*File{f}, where: make(map[string]*File, len(f.tensors))}
		for _, t := range f.tensors {
			s.where[t.Name] = f
			s.names = append(s.names, t.Name)
		}
		return s, nil
	}
	indexPath := filepath.Join(dir, IndexFile)
	weightMap, err := readIndex(indexPath)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("safetensors: %s has neither %s nor %s", dir, SingleFile, IndexFile)
	}
	if err != nil {
		return nil, err
	}
	s, err := openShards(dir, weightMap)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", indexPath, err)
	}
	return s, nil
}

// readIndex returns the weight_map of an index file: tensor name -> shard.
func readIndex(path string) (map[string]string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if st.Size() > maxIndexSize {
		return nil, fmt.Errorf("safetensors: %s: %d bytes exceeds the cap of %d", path, st.Size(), maxIndexSize)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	m, err := parseIndex(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

// parseIndex parses {"metadata": {...}, "weight_map": {name: file}},
// rejecting duplicate names like the header parser.
func parseIndex(b []byte) (map[string]string, error) {
	r := newJSONReader(b)
	var weightMap map[string]string
	err := r.object("index", func(key string) error {
		if key != "weight_map" {
			return r.skip("index " + key)
		}
		m, err := r.stringMap("weight_map")
		weightMap = m
		return err
	})
	if err != nil {
		return nil, err
	}
	if err := r.end(); err != nil {
		return nil, err
	}
	if weightMap == nil {
		return nil, formatErr("index has no weight_map")
	}
	return weightMap, nil
}

func openShards(dir string, weightMap map[string]string) (*Set, error) {
	s := &Set{where: make(map[string]*File, len(weightMap))}
	if err := s.openShards(dir, weightMap); err != nil {
		s.Close() // unmap the shards opened before the error
		return nil, err
	}
	return s, nil
}

func (s *Set) openShards(dir string, weightMap map[string]string) error {
	var shards []string
	for _, shard := range weightMap {
		shards = append(shards, shard)
	}
	slices.Sort(shards)
	shards = slices.Compact(shards)
	// Open every shard before cross-checking, so that a missing file is
	// reported as missing rather than as a mismatch elsewhere.
	byName := map[string]*File{}
	for _, shard := range shards {
		// Shard names come from a downloaded file: keep them inside dir.
		if !filepath.IsLocal(shard) {
			return fmt.Errorf("shard name %q is not a path inside the model directory", shard)
		}
		f, err := Open(filepath.Join(dir, filepath.FromSlash(shard)))
		if err != nil {
			return err
		}
		s.files = append(s.files, f)
		byName[shard] = f
	}
	for _, shard := range shards {
		f := byName[shard]
		for _, t := range f.tensors {
			mapped, ok := weightMap[t.Name]
			if !ok {
				return fmt.Errorf("tensor %q is in shard %s but not in the weight_map", t.Name, shard)
			}
			if mapped != shard {
				return fmt.Errorf("tensor %q is in shard %s but the weight_map puts it in %s", t.Name, shard, mapped)
			}
			s.where[t.Name] = f
		}
	}
	for name, shard := range weightMap {
		if _, ok := byName[shard].index[name]; !ok {
			return fmt.Errorf("the weight_map puts tensor %q in shard %s, which does not hold it", name, shard)
		}
		s.names = append(s.names, name)
	}
	slices.Sort(s.names)
	return nil
}

// Tensor returns the tensor called name, from whichever file holds it.
func (s *Set) Tensor(name string) (TensorInfo, bool) {
	f, ok := s.where[name]
	if !ok {
		return TensorInfo{}, false
	}
	return f.Tensor(name)
}

// Names returns every tensor name, sorted.
func (s *Set) Names() []string { return slices.Clone(s.names) }

// Close unmaps every file; the tensors' Data must not be touched after it.
func (s *Set) Close() error {
	var errs []error
	for _, f := range s.files {
		errs = append(errs, f.Close())
	}
	s.files = nil
	return errors.Join(errs...)
}
