package gguf

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ValueType is the type tag of a metadata value, numbered as on disk.
type ValueType uint32

// Metadata value types.
const (
	TypeUint8   ValueType = 0
	TypeInt8    ValueType = 1
	TypeUint16  ValueType = 2
	TypeInt16   ValueType = 3
	TypeUint32  ValueType = 4
	TypeInt32   ValueType = 5
	TypeFloat32 ValueType = 6
	TypeBool    ValueType = 7
	TypeString  ValueType = 8
	TypeArray   ValueType = 9
	TypeUint64  ValueType = 10
	TypeInt64   ValueType = 11
	TypeFloat64 ValueType = 12
)

var valueTypeNames = [...]string{"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool", "string", "array", "uint64", "int64", "float64"}

func (t ValueType) String() string {
	if int(t) < len(valueTypeNames) {
		return valueTypeNames[t]
	}
	return fmt.Sprintf("ValueType(%d)", uint32(t))
}

func (t ValueType) valid() bool { return int(t) < len(valueTypeNames) }

// fixedSize is the encoded size of a scalar of type t; 0 for strings and
// arrays, whose size depends on their contents.
func (t ValueType) fixedSize() int {
	switch t {
	case TypeUint8, TypeInt8, TypeBool:
		return 1
	case TypeUint16, TypeInt16:
		return 2
	case TypeUint32, TypeInt32, TypeFloat32:
		return 4
	case TypeUint64, TypeInt64, TypeFloat64:
		return 8
	}
	return 0
}

// minSize is the smallest encoding of one value of type t, which bounds how
// many of them the rest of a file can hold.
func (t ValueType) minSize() int {
	switch t {
	case TypeString:
		return 8 // length
	case TypeArray:
		return 4 + 8 // element type, count
	}
	return t.fixedSize()
}

func (t ValueType) isInteger() bool {
	switch t {
	case TypeUint8, TypeInt8, TypeUint16, TypeInt16, TypeUint32, TypeInt32, TypeUint64, TypeInt64:
		return true
	}
	return false
}

func (t ValueType) isSigned() bool {
	return t == TypeInt8 || t == TypeInt16 || t == TypeInt32 || t == TypeInt64
}

// Value is one metadata value: a scalar, a string, or an array of values of
// one type (arrays may nest). The zero Value is uint8 0.
//
// Values are immutable: the array constructors copy their argument and the
// As accessors return copies of array contents.
type Value struct {
	typ  ValueType
	elem ValueType // element type of an array
	bits uint64    // integers (sign-extended), bools, float bits
	str  string
	arr  any // []uint8, []int8, ..., []string, []Value (nested arrays)
}

// Type is the value's type tag.
func (v Value) Type() ValueType { return v.typ }

// ElemType is the element type of an array (meaningless for other values).
func (v Value) ElemType() ValueType { return v.elem }

// Len is the number of elements of an array, 0 for other values.
func (v Value) Len() int {
	switch a := v.arr.(type) {
	case nil:
		return 0
	case []uint8:
		return len(a)
	case []int8:
		return len(a)
	case []uint16:
		return len(a)
	case []int16:
		return len(a)
	case []uint32:
		return len(a)
	case []int32:
		return len(a)
	case []float32:
		return len(a)
	case []bool:
		return len(a)
	case []string:
		return len(a)
	case []Value:
		return len(a)
	case []uint64:
		return len(a)
	case []int64:
		return len(a)
	case []float64:
		return len(a)
	}
	return 0
}

// Uint8Value makes a uint8 value.
func Uint8Value(x uint8) Value { return Value{typ: TypeUint8, bits: uint64(x)} }

// Int8Value makes an int8 value.
func Int8Value(x int8) Value { return Value{typ: TypeInt8, bits: uint64(int64(x))} }

// Uint16Value makes a uint16 value.
func Uint16Value(x uint16) Value { return Value{typ: TypeUint16, bits: uint64(x)} }

// Int16Value makes an int16 value.
func Int16Value(x int16) Value { return Value{typ: TypeInt16, bits: uint64(int64(x))} }

// Uint32Value makes a uint32 value.
func Uint32Value(x uint32) Value { return Value{typ: TypeUint32, bits: uint64(x)} }

// Int32Value makes an int32 value.
func Int32Value(x int32) Value { return Value{typ: TypeInt32, bits: uint64(int64(x))} }

// Uint64Value makes a uint64 value.
func Uint64Value(x uint64) Value { return Value{typ: TypeUint64, bits: x} }

// Int64Value makes an int64 value.
func Int64Value(x int64) Value { return Value{typ: TypeInt64, bits: uint64(x)} }

// Float32Value makes a float32 value.
func Float32Value(x float32) Value { return Value{typ: TypeFloat32, bits: uint64(math.Float32bits(x))} }

// Float64Value makes a float64 value.
func Float64Value(x float64) Value { return Value{typ: TypeFloat64, bits: math.Float64bits(x)} }

// StringValue makes a string value.
func StringValue(s string) Value { return Value{typ: TypeString, str: s} }

// BoolValue makes a bool value.
func BoolValue(b bool) Value {
	v := Value{typ: TypeBool}
	if b {
		v.bits = 1
	}
	return v
}

// Uint8sValue makes an array of uint8.
func Uint8sValue(xs []uint8) Value { return arrayOf(TypeUint8, xs) }

// Int8sValue makes an array of int8.
func Int8sValue(xs []int8) Value { return arrayOf(TypeInt8, xs) }

// Uint16sValue makes an array of uint16.
func Uint16sValue(xs []uint16) Value { return arrayOf(TypeUint16, xs) }

// Int16sValue makes an array of int16.
func Int16sValue(xs []int16) Value { return arrayOf(TypeInt16, xs) }

// Uint32sValue makes an array of uint32.
func Uint32sValue(xs []uint32) Value { return arrayOf(TypeUint32, xs) }

// Int32sValue makes an array of int32.
func Int32sValue(xs []int32) Value { return arrayOf(TypeInt32, xs) }

// Uint64sValue makes an array of uint64.
func Uint64sValue(xs []uint64) Value { return arrayOf(TypeUint64, xs) }

// Int64sValue makes an array of int64.
func Int64sValue(xs []int64) Value { return arrayOf(TypeInt64, xs) }

// Float32sValue makes an array of float32.
func Float32sValue(xs []float32) Value { return arrayOf(TypeFloat32, xs) }

// Float64sValue makes an array of float64.
func Float64sValue(xs []float64) Value { return arrayOf(TypeFloat64, xs) }

// BoolsValue makes an array of bool.
func BoolsValue(xs []bool) Value { return arrayOf(TypeBool, xs) }

// StringsValue makes an array of string.
func StringsValue(xs []string) Value { return arrayOf(TypeString, xs) }

// ArraysValue makes an array of arrays. Each element must itself be an
// array (their element types may differ); WriteTo rejects anything else.
func ArraysValue(xs []Value) Value { return arrayOf(TypeArray, xs) }

func arrayOf[T any](elem ValueType, xs []T) Value {
	return Value{typ: TypeArray, elem: elem, arr: append([]T(nil), xs...)}
}

// AsUint returns an integer value that is non-negative, of any integer
// type: metadata writers disagree on uint32 versus uint64 for counts.
func (v Value) AsUint() (uint64, bool) {
	if !v.typ.isInteger() || (v.typ.isSigned() && int64(v.bits) < 0) {
		return 0, false
	}
	return v.bits, true
}

// AsInt returns an integer value of any type that fits in an int64.
func (v Value) AsInt() (int64, bool) {
	if !v.typ.isInteger() || (!v.typ.isSigned() && v.bits > math.MaxInt64) {
		return 0, false
	}
	return int64(v.bits), true
}

// AsFloat returns a float32 or float64 value, or an integer value converted
// (a config float such as rope_freq_base is sometimes written as an integer).
func (v Value) AsFloat() (float64, bool) {
	switch {
	case v.typ == TypeFloat32:
		return float64(math.Float32frombits(uint32(v.bits))), true
	case v.typ == TypeFloat64:
		return math.Float64frombits(v.bits), true
	case v.typ.isSigned():
		return float64(int64(v.bits)), true
	case v.typ.isInteger():
		return float64(v.bits), true
	}
	return 0, false
}

// AsBool returns a bool value.
func (v Value) AsBool() (bool, bool) {
	if v.typ != TypeBool {
		return false, false
	}
	return v.bits != 0, true
}

// AsString returns a string value.
func (v Value) AsString() (string, bool) {
	if v.typ != TypeString {
		return "", false
	}
	return v.str, true
}

// AsStrings returns a copy of a string array.
func (v Value) AsStrings() ([]string, bool) {
	a, ok := v.arr.([]string)
	if !ok || v.typ != TypeArray {
		return nil, false
	}
	return append([]string(nil), a...), true
}

// AsFloat32s returns a copy of a float32 array.
func (v Value) AsFloat32s() ([]float32, bool) {
	a, ok := v.arr.([]float32)
	if !ok || v.typ != TypeArray {
		return nil, false
	}
	return append([]float32(nil), a...), true
}

// AsFloat64s returns a float32 or float64 array as float64s.
func (v Value) AsFloat64s() ([]float64, bool) {
	switch a := v.arr.(type) {
	case []float32:
		out := make([]float64, len(a))
		for i, x := range a {
			out[i] = float64(x)
		}
		return out, true
	case []float64:
		return append([]float64(nil), a...), true
	}
	return nil, false
}

// AsInt32s returns an integer array of any element type whose elements all
// fit in an int32.
func (v Value) AsInt32s() ([]int32, bool) {
	if a, ok := v.arr.([]int32); ok {
		return append([]int32(nil), a...), true
	}
	xs, ok := v.AsInt64s()
	if !ok {
		return nil, false
	}
	out := make([]int32, len(xs))
	for i, x := range xs {
		if x < math.MinInt32 || x > math.MaxInt32 {
			return nil, false
		}
		out[i] = int32(x)
	}
	return out, true
}

// AsInt64s returns an integer array of any element type whose elements all
// fit in an int64.
func (v Value) AsInt64s() ([]int64, bool) {
	switch a := v.arr.(type) {
	case []uint8:
		return widen(a), true
	case []int8:
		return widen(a), true
	case []uint16:
		return widen(a), true
	case []int16:
		return widen(a), true
	case []uint32:
		return widen(a), true
	case []int32:
		return widen(a), true
	case []int64:
		return append([]int64(nil), a...), true
	case []uint64:
		out := make([]int64, len(a))
		for i, x := range a {
			if x > math.MaxInt64 {
				return nil, false
			}
			out[i] = int64(x)
		}
		return out, true
	}
	return nil, false
}

func widen[T uint8 | int8 | uint16 | int16 | uint32 | int32](xs []T) []int64 {
	out := make([]int64, len(xs))
	for i, x := range xs {
		out[i] = int64(x)
	}
	return out
}

// AsBools returns a copy of a bool array.
func (v Value) AsBools() ([]bool, bool) {
	a, ok := v.arr.([]bool)
	if !ok {
		return nil, false
	}
	return append([]bool(nil), a...), true
}

// AsArrays returns the elements of an array of arrays.
func (v Value) AsArrays() ([]Value, bool) {
	a, ok := v.arr.([]Value)
	if !ok {
		return nil, false
	}
	return append([]Value(nil), a...), true
}

// maxShown bounds how many array elements String prints: vocabularies have
// hundreds of thousands.
const maxShown = 8

// String formats the value for people (inspect output, errors). Long
// arrays are abbreviated.
func (v Value) String() string {
	switch v.typ {
	case TypeString:
		return strconv.Quote(v.str)
	case TypeBool:
		return strconv.FormatBool(v.bits != 0)
	case TypeFloat32, TypeFloat64:
		f, _ := v.AsFloat()
		bitSize := 64
		if v.typ == TypeFloat32 {
			bitSize = 32
		}
		return strconv.FormatFloat(f, 'g', -1, bitSize)
	case TypeArray:
		return v.arrayString()
	}
	if v.typ.isSigned() {
		return strconv.FormatInt(int64(v.bits), 10)
	}
	return strconv.FormatUint(v.bits, 10)
}

func (v Value) arrayString() string {
	n := v.Len()
	var b strings.Builder
	fmt.Fprintf(&b, "[%v x %d]{", v.elem, n)
	for i := 0; i < n && i < maxShown; i++ {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(v.index(i).String())
	}
	if n > maxShown {
		b.WriteString(", ...")
	}
	b.WriteString("}")
	return b.String()
}

// index returns element i of an array as a Value.
func (v Value) index(i int) Value {
	switch a := v.arr.(type) {
	case []uint8:
		return Uint8Value(a[i])
	case []int8:
		return Int8Value(a[i])
	case []uint16:
		return Uint16Value(a[i])
	case []int16:
		return Int16Value(a[i])
	case []uint32:
		return Uint32Value(a[i])
	case []int32:
		return Int32Value(a[i])
	case []float32:
		return Float32Value(a[i])
	case []bool:
		return BoolValue(a[i])
	case []string:
		return StringValue(a[i])
	case []Value:
		return a[i]
	case []uint64:
		return Uint64Value(a[i])
	case []int64:
		return Int64Value(a[i])
	case []float64:
		return Float64Value(a[i])
	}
	return Value{}
}
