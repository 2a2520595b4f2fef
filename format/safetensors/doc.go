// Package safetensors reads the safetensors weight format of Hugging Face
// models: a JSON header naming each tensor's dtype, shape and byte range,
// then the raw little-endian tensor bytes.
//
// Open maps a file read-only and validates the whole header before returning,
// so the loader never meets an out-of-range or mis-sized tensor: duplicate
// names (detected in the raw JSON, where a map would silently keep one),
// unknown dtypes, shapes whose element count overflows, byte ranges that
// leave the data section, disagree with dtype and shape, or overlap. Tensor
// data is returned as slices of the mapping (no copy), valid until Close.
// OpenDir opens a model directory, single-file or sharded.
//
// # On-disk layout
//
//	offset 0
//	+-----------------------------------------------------------------+
//	| N: header length, u64 little-endian (at most 100 MiB here)      |
//	+-----------------------------------------------------------------+ 8
//	| header: N bytes of UTF-8 JSON, possibly padded with spaces      |
//	|   {                                                             |
//	|     "__metadata__": {"format": "pt", ...},   optional, str->str |
//	|     "model.embed_tokens.weight": {                              |
//	|       "dtype": "BF16",                                          |
//	|       "shape": [vocab, hidden],               outermost first   |
//	|       "data_offsets": [begin, end]            into the data     |
//	|     },                                                          |
//	|     ...                                                         |
//	|   }                                                             |
//	+-----------------------------------------------------------------+ 8+N
//	| data section: tensor bytes, row-major, little-endian;           |
//	| a tensor is bytes [8+N+begin, 8+N+end) of the file, and         |
//	| end-begin = product(shape) * size(dtype)                        |
//	+-----------------------------------------------------------------+
//
// A sharded model keeps shards model-0000i-of-0000n.safetensors beside
//
//	model.safetensors.index.json:
//	{"metadata": {"total_size": ...}, "weight_map": {"tensor name": "shard file", ...}}
//
// # Example
//
//	set, err := safetensors.OpenDir("/models/Qwen3-0.6B")
//	if err != nil {
//		return err
//	}
//	defer set.Close()
//	emb, ok := set.Tensor("model.embed_tokens.weight") // emb.Shape = [vocab, hidden]
package safetensors
