// A span's OTLP encodings in C: the same bytes as otlp.span_json and otlp.span_pb (tests/test_native_encode.py
// compares them), for the drain thread, where encoding a sampled collective's span was a third of its cost
// in Python (formatting three doubles alone, with the interpreter's dtoa, about 1.5 us).
//
// What recurs from span to span is encoded by the Python side and cached there (a call site's block of
// attributes, a span name, an attribute key's JSON): this reads those caches and asks Python on a miss. A
// span with events, links or an error status, and an attribute value other than a bool, an int of 64 bits or a
// finite float, go to the Python encoders, which handle every case.
//
// Contract with the Python side (otlp.use_native): encode_setup() once per load with the objects below.
#include <Python.h>

#include <charconv>
#include <cstdint>
#include <cstring>
#include <string>

#include "common.h"

namespace otel_encode {
namespace {

using otel_native::Ref;

struct Globals {
  PyObject* json_fallback = nullptr;  // otlp.span_json(span) (Python)
  PyObject* pb_fallback = nullptr;  // otlp.span_pb(span)
  PyObject* pair_json = nullptr;  // wire.pair_json(key, value) -> str
  PyObject* pair_pb = nullptr;  // wire.pair_pb(key, value) -> bytes (field 9)
  PyObject* block_json_cache = nullptr;  // wire._block_json: block -> str
  PyObject* block_json = nullptr;  // wire.block_json(block)
  PyObject* block_pb_cache = nullptr;  // wire._block_pb: block -> bytes
  PyObject* block_pb = nullptr;  // wire.block_pb(9, block)
  PyObject* key_json_cache = nullptr;  // wire._key_json_cache: key -> '{"key":...,"value":'
  PyObject* key_json = nullptr;  // wire._key_json(key)
  PyObject* name_json = nullptr;  // otlp._name_json: name -> its JSON string
  PyObject* name_pb = nullptr;  // otlp._name_pb: name -> Span.name, field 5 encoded
  PyObject *s_name, *s_trace_id, *s_span_id, *s_parent, *s_start, *s_end, *s_attributes, *s_shared, *s_error,
      *s_events, *s_links, *s_sampled, *s_remote, *sixty_four, *nine;
  bool ready = false;
};

Globals G;

// What the span's fields say, read once.
struct Fields {
  Ref name, trace_id, span_id, parent, start, end, attributes, shared;
  uint64_t trace_hi = 0, trace_lo = 0, span = 0, parent_id = 0;
  int64_t start_ns = 0, end_ns = 0;
  uint32_t flags = 0;
  bool has_parent = false;
};

enum Read { kOk, kFallback, kError };

// The span's fields; kFallback when it is one for the Python encoder (events, links, an error, a value out of
// range).
Read read(PyObject* s, Fields& f) {
  {
    Ref events(PyObject_GetAttr(s, G.s_events));
    if (events.p == nullptr) return kError;
    int truth = PyObject_IsTrue(events.p);
    if (truth < 0) return kError;
    if (truth) return kFallback;
    Ref links(PyObject_GetAttr(s, G.s_links));
    if (links.p == nullptr) return kError;
    if ((truth = PyObject_IsTrue(links.p)) != 0) return truth < 0 ? kError : kFallback;
    Ref error(PyObject_GetAttr(s, G.s_error));
    if (error.p == nullptr) return kError;
    if (error.p != Py_None) return kFallback;
  }
  PyObject** slots[] = {&f.name.p, &f.trace_id.p, &f.span_id.p, &f.parent.p, &f.start.p, &f.end.p, &f.attributes.p, &f.shared.p};
  PyObject* names[] = {G.s_name, G.s_trace_id, G.s_span_id, G.s_parent, G.s_start, G.s_end, G.s_attributes, G.s_shared};
  for (size_t i = 0; i < 8; ++i) {
    *slots[i] = PyObject_GetAttr(s, names[i]);
    if (*slots[i] == nullptr) return kError;
  }
  if (!PyLong_CheckExact(f.trace_id.p) || !PyLong_CheckExact(f.span_id.p) || !PyLong_CheckExact(f.start.p) ||
      !PyLong_CheckExact(f.end.p) || !PyUnicode_CheckExact(f.name.p) || !PyList_CheckExact(f.attributes.p) ||
      !PyTuple_CheckExact(f.shared.p))
    return kFallback;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(f.attributes.p); ++i) {  // pairs, as the encoders below read them
    PyObject* pair = PyList_GET_ITEM(f.attributes.p, i);
    if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2) return kFallback;
  }
  // The trace id's two halves; out of range (negative, over 128 bits) is the Python encoder's to report.
  f.trace_lo = PyLong_AsUnsignedLongLongMask(f.trace_id.p);
  if (PyErr_Occurred()) return kError;
  Ref hi(PyNumber_Rshift(f.trace_id.p, G.sixty_four));
  if (hi.p == nullptr) return kError;
  f.trace_hi = PyLong_AsUnsignedLongLong(hi.p);
  if (PyErr_Occurred()) {
    PyErr_Clear();
    return kFallback;
  }
  f.span = PyLong_AsUnsignedLongLong(f.span_id.p);
  if (PyErr_Occurred()) {
    PyErr_Clear();
    return kFallback;
  }
  if (f.parent.p != Py_None) {
    if (!PyLong_CheckExact(f.parent.p)) return kFallback;
    f.parent_id = PyLong_AsUnsignedLongLong(f.parent.p);
    if (PyErr_Occurred()) {
      PyErr_Clear();
      return kFallback;
    }
    f.has_parent = f.parent_id != 0;  // the Python encoders test the id's truth
  }
  int overflow = 0;
  f.start_ns = PyLong_AsLongLongAndOverflow(f.start.p, &overflow);
  if (overflow || f.start_ns < 0) return kFallback;
  f.end_ns = PyLong_AsLongLongAndOverflow(f.end.p, &overflow);
  if (overflow || f.end_ns < 0) return kFallback;
  if (PyErr_Occurred()) return kError;
  int flag[2];
  PyObject* flag_names[] = {G.s_sampled, G.s_remote};
  for (int i = 0; i < 2; ++i) {
    Ref v(PyObject_GetAttr(s, flag_names[i]));
    if (v.p == nullptr) return kError;
    flag[i] = PyObject_IsTrue(v.p);
    if (flag[i] < 0) return kError;
  }
  // otlp._flags: W3C sampled (bit 0); bit 8 says bit 9 is known; bit 9, the parent is remote
  f.flags = (flag[0] ? 0x001 : 0) | 0x100 | (flag[1] ? 0x200 : 0);
  return kOk;
}

// ------------------------------------------------------------------------------------------------ text
void hex(std::string& out, uint64_t v, int digits) {
  static const char kHex[] = "0123456789abcdef";
  char buf[16];
  for (int i = digits - 1; i >= 0; --i) {
    buf[i] = kHex[v & 0xF];
    v >>= 4;
  }
  out.append(buf, digits);
}

void decimal(std::string& out, int64_t v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, r.ptr - buf);
}

bool append_str(std::string& out, PyObject* s) {  // a str's UTF-8 (ASCII here: JSON the Python side escaped)
  Py_ssize_t n;
  const char* p = PyUnicode_AsUTF8AndSize(s, &n);
  if (p == nullptr) return false;
  out.append(p, n);
  return true;
}

// Python's repr of a finite float: the shortest digits that read back to the same double, laid out as
// float.__repr__ does (an exponent below 1e-4 and from 1e16, at least two exponent digits, ".0" on an
// integral value).
bool repr_double(std::string& out, double v) {  // false with an error set
#if defined(__cpp_lib_to_chars) && __cpp_lib_to_chars >= 201611L
  char buf[40];
  auto r = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  const char* p = buf;
  if (*p == '-') {
    out.push_back('-');
    ++p;
  }
  char digits[24];
  int n = 0;
  for (; p < r.ptr && *p != 'e'; ++p)
    if (*p != '.') digits[n++] = *p;
  int exp10 = 0;
  std::from_chars(p + 1 + (p[1] == '+'), r.ptr, exp10);
  int decpt = exp10 + 1;  // value = 0.digits x 10^decpt
  if (decpt <= -4 || decpt > 16) {
    out.push_back(digits[0]);
    if (n > 1) {
      out.push_back('.');
      out.append(digits + 1, n - 1);
    }
    char e[8];
    int len = snprintf(e, sizeof(e), "e%+.02d", decpt - 1);
    out.append(e, len);
  } else if (decpt <= 0) {
    out.append("0.");
    out.append(-decpt, '0');
    out.append(digits, n);
  } else if (decpt >= n) {
    out.append(digits, n);
    out.append(decpt - n, '0');
    out.append(".0");
  } else {
    out.append(digits, decpt);
    out.push_back('.');
    out.append(digits + decpt, n - decpt);
  }
#else
  char* s = PyOS_double_to_string(v, 'r', 0, Py_DTSF_ADD_DOT_0, nullptr);
  if (s == nullptr) return false;
  out.append(s);
  PyMem_Free(s);
#endif
  return true;
}

// A cached encoding (a str or bytes value of ``cache``), or what ``fill(args)`` makes of it.
PyObject* cached(PyObject* cache, PyObject* key, PyObject* fill, PyObject* arg0, PyObject* arg1 = nullptr) {
  PyObject* hit = PyDict_GetItemWithError(cache, key);
  if (hit != nullptr) return Py_NewRef(hit);
  if (PyErr_Occurred()) return nullptr;
  return arg1 == nullptr ? PyObject_CallOneArg(fill, arg0) : PyObject_CallFunctionObjArgs(fill, arg0, arg1, nullptr);
}

// One (key, value) pair of span.attributes as wire.attributes_json encodes it; false with an error set.
bool pair_json(std::string& out, PyObject* pair) {
  if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2) {  // read() checked; the list changed since
    PyErr_SetString(PyExc_RuntimeError, "a span's attributes changed while it was encoded");
    return false;
  }
  PyObject* key = PyTuple_GET_ITEM(pair, 0);
  PyObject* value = PyTuple_GET_ITEM(pair, 1);
  if (PyFloat_CheckExact(value) || (PyLong_CheckExact(value))) {
    double d = 0;
    long long i = 0;
    bool is_float = PyFloat_CheckExact(value);
    bool direct = true;
    if (is_float) {
      d = PyFloat_AS_DOUBLE(value);
      direct = d - d == 0;  // finite: NaN and infinities take the Python path
    } else {
      int overflow = 0;
      i = PyLong_AsLongLongAndOverflow(value, &overflow);
      if (i == -1 && PyErr_Occurred()) return false;
      direct = !overflow;
    }
    if (direct && PyUnicode_CheckExact(key)) {
      Ref prefix(cached(G.key_json_cache, key, G.key_json, key));
      if (prefix.p == nullptr || !append_str(out, prefix.p)) return false;
      if (is_float) {
        out.append("{\"doubleValue\":");
        if (!repr_double(out, d)) return false;
        out.append("}}");
      } else {
        out.append("{\"intValue\":\"");
        decimal(out, i);
        out.append("\"}}");
      }
      return true;
    }
  }
  Ref enc(PyObject_CallFunctionObjArgs(G.pair_json, key, value, nullptr));
  return enc.p != nullptr && append_str(out, enc.p);
}

// The span's fields and its name's encoding (from ``names``, a cache the Python encoder fills): kFallback for a
// span the Python encoder takes, a name it has not seen yet included (it caches it for the next span).
Read start(PyObject* s, Fields& f, PyObject* names, PyObject** name) {
  if (!G.ready) {
    PyErr_SetString(PyExc_RuntimeError, "encode_setup() was not called");
    return kError;
  }
  Read r = read(s, f);
  if (r != kOk) return r;
  *name = PyDict_GetItemWithError(names, f.name.p);
  if (*name == nullptr) return PyErr_Occurred() ? kError : kFallback;
  return kOk;
}

PyObject* span_json(PyObject*, PyObject* s) {
  Fields f;
  PyObject* name = nullptr;
  switch (start(s, f, G.name_json, &name)) {
    case kError: return nullptr;
    case kFallback: return PyObject_CallOneArg(G.json_fallback, s);
    case kOk: break;
  }
  std::string out;
  out.reserve(2048);
  out.append("{\"traceId\":\"");
  hex(out, f.trace_hi, 16);
  hex(out, f.trace_lo, 16);
  out.append("\",\"spanId\":\"");
  hex(out, f.span, 16);
  out.append("\",");
  if (f.has_parent) {
    out.append("\"parentSpanId\":\"");
    hex(out, f.parent_id, 16);
    out.append("\",");
  }
  out.append("\"flags\":");
  decimal(out, f.flags);
  out.append(",\"name\":");
  if (!append_str(out, name)) return nullptr;
  out.append(",\"kind\":1,\"startTimeUnixNano\":\"");
  decimal(out, f.start_ns);
  out.append("\",\"endTimeUnixNano\":\"");
  decimal(out, f.end_ns);
  out.append("\",\"attributes\":[");
  bool first = true;
  for (Py_ssize_t i = 0, n = PyTuple_GET_SIZE(f.shared.p); i < n; ++i) {
    PyObject* block = PyTuple_GET_ITEM(f.shared.p, i);
    int truth = PyObject_IsTrue(block);
    if (truth < 0) return nullptr;
    if (!truth) continue;
    Ref enc(cached(G.block_json_cache, block, G.block_json, block));
    if (enc.p == nullptr) return nullptr;
    if (!first) out.push_back(',');
    if (!append_str(out, enc.p)) return nullptr;
    first = false;
  }
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(f.attributes.p); ++i) {
    if (!first) out.push_back(',');
    PyObject* pair = Py_NewRef(PyList_GET_ITEM(f.attributes.p, i));
    bool ok = pair_json(out, pair);
    Py_DECREF(pair);
    if (!ok) return nullptr;
    first = false;
  }
  out.append("]}");
  return PyUnicode_FromStringAndSize(out.data(), Py_ssize_t(out.size()));
}

// --------------------------------------------------------------------------------------------- protobuf
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(char(v));
}

void big_endian(std::string& out, uint64_t v) {
  char buf[8];
  for (int i = 7; i >= 0; --i) {
    buf[i] = char(v & 0xFF);
    v >>= 8;
  }
  out.append(buf, 8);
}

void little_endian(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) {
    out.push_back(char(v & 0xFF));
    v >>= 8;
  }
}

bool append_bytes(std::string& out, PyObject* b) {
  char* p;
  Py_ssize_t n;
  if (PyBytes_AsStringAndSize(b, &p, &n) < 0) return false;
  out.append(p, n);
  return true;
}

// One (key, value) pair as wire.attributes_pb(9, ...) encodes it: a Span.attributes KeyValue.
bool pair_pb(std::string& out, PyObject* pair) {
  if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2) {  // read() checked; the list changed since
    PyErr_SetString(PyExc_RuntimeError, "a span's attributes changed while it was encoded");
    return false;
  }
  PyObject* key = PyTuple_GET_ITEM(pair, 0);
  PyObject* value = PyTuple_GET_ITEM(pair, 1);
  std::string av;  // the AnyValue body
  if (PyFloat_CheckExact(value)) {
    double d = PyFloat_AS_DOUBLE(value);
    uint64_t bits;
    std::memcpy(&bits, &d, 8);
    av.push_back('\x21');  // double_value = 4
    little_endian(av, bits, 8);
  } else if (PyBool_Check(value)) {
    av.append(value == Py_True ? "\x10\x01" : "\x10\x00", 2);  // bool_value = 2
  } else if (PyLong_CheckExact(value)) {
    int overflow = 0;
    long long i = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (i == -1 && PyErr_Occurred()) return false;
    if (overflow) av.clear();
    else {
      av.push_back('\x18');  // int_value = 3: int64 negatives are ten-byte two's complement varints
      varint(av, uint64_t(i));
    }
  }
  Py_ssize_t klen = 0;
  const char* k = av.empty() || !PyUnicode_CheckExact(key) ? nullptr : PyUnicode_AsUTF8AndSize(key, &klen);
  if (k == nullptr) {
    PyErr_Clear();  // a key that is not valid UTF-8: the Python encoder says so
    Ref enc(PyObject_CallFunctionObjArgs(G.pair_pb, key, value, nullptr));
    return enc.p != nullptr && append_bytes(out, enc.p);
  }
  std::string kv;
  kv.push_back('\x0a');  // KeyValue.key = 1
  varint(kv, uint64_t(klen));
  kv.append(k, klen);
  kv.push_back('\x12');  // KeyValue.value = 2
  varint(kv, av.size());
  kv += av;
  out.push_back('\x4a');  // Span.attributes = 9
  varint(out, kv.size());
  out += kv;
  return true;
}

PyObject* span_pb(PyObject*, PyObject* s) {
  Fields f;
  PyObject* name = nullptr;
  switch (start(s, f, G.name_pb, &name)) {
    case kError: return nullptr;
    case kFallback: return PyObject_CallOneArg(G.pb_fallback, s);
    case kOk: break;
  }
  std::string body;
  body.reserve(1280);
  body.append("\x0a\x10", 2);  // trace_id = 1
  big_endian(body, f.trace_hi);
  big_endian(body, f.trace_lo);
  body.append("\x12\x08", 2);  // span_id = 2
  big_endian(body, f.span);
  if (f.has_parent) {
    body.append("\x22\x08", 2);  // parent_span_id = 4
    big_endian(body, f.parent_id);
  }
  if (!append_bytes(body, name)) return nullptr;
  body.append("\x30\x01\x39", 3);  // kind = internal, start_time_unix_nano = 7 (fixed64)
  little_endian(body, uint64_t(f.start_ns), 8);
  body.push_back('\x41');  // end_time_unix_nano = 8
  little_endian(body, uint64_t(f.end_ns), 8);
  for (Py_ssize_t i = 0, n = PyTuple_GET_SIZE(f.shared.p); i < n; ++i) {
    PyObject* block = PyTuple_GET_ITEM(f.shared.p, i);
    Ref enc(cached(G.block_pb_cache, block, G.block_pb, G.nine, block));
    if (enc.p == nullptr || !append_bytes(body, enc.p)) return nullptr;
  }
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(f.attributes.p); ++i) {
    PyObject* pair = Py_NewRef(PyList_GET_ITEM(f.attributes.p, i));
    bool ok = pair_pb(body, pair);
    Py_DECREF(pair);
    if (!ok) return nullptr;
  }
  body.append("\x85\x01", 2);  // flags = 16 (fixed32)
  little_endian(body, f.flags, 4);
  std::string out;
  out.reserve(body.size() + 6);
  out.push_back('\x12');  // ScopeSpans.spans = 2
  varint(out, body.size());
  out += body;
  return PyBytes_FromStringAndSize(out.data(), Py_ssize_t(out.size()));
}

PyObject* double_repr(PyObject*, PyObject* v) {  // for the tests: repr_double against float.__repr__
  double d = PyFloat_AsDouble(v);
  if (d == -1.0 && PyErr_Occurred()) return nullptr;
  std::string out;
  if (!repr_double(out, d)) return nullptr;
  return PyUnicode_FromStringAndSize(out.data(), Py_ssize_t(out.size()));
}

PyObject* setup(PyObject*, PyObject* config) {
  if (!PyDict_Check(config)) {
    PyErr_SetString(PyExc_TypeError, "encode_setup(dict)");
    return nullptr;
  }
  struct Item {
    const char* key;
    PyObject** slot;
    bool dict;
  } items[] = {
      {"json_fallback", &G.json_fallback, false}, {"pb_fallback", &G.pb_fallback, false},
      {"pair_json", &G.pair_json, false},         {"pair_pb", &G.pair_pb, false},
      {"block_json_cache", &G.block_json_cache, true}, {"block_json", &G.block_json, false},
      {"block_pb_cache", &G.block_pb_cache, true}, {"block_pb", &G.block_pb, false},
      {"key_json_cache", &G.key_json_cache, true}, {"key_json", &G.key_json, false},
      {"name_json", &G.name_json, true},          {"name_pb", &G.name_pb, true},
  };
  PyObject* found[sizeof(items) / sizeof(items[0])];
  for (size_t i = 0; i < sizeof(items) / sizeof(items[0]); ++i) {  // all checked before any is kept
    found[i] = PyDict_GetItemString(config, items[i].key);
    if (found[i] == nullptr || (items[i].dict ? !PyDict_Check(found[i]) : !PyCallable_Check(found[i]))) {
      PyErr_Format(PyExc_ValueError, "encode_setup: %s missing or of the wrong type", items[i].key);
      return nullptr;
    }
  }
  for (size_t i = 0; i < sizeof(items) / sizeof(items[0]); ++i) {
    Py_XSETREF(*items[i].slot, Py_NewRef(found[i]));
  }
  struct Name {
    PyObject** slot;
    const char* text;
  } names[] = {{&G.s_name, "name"}, {&G.s_trace_id, "trace_id"}, {&G.s_span_id, "span_id"},
               {&G.s_parent, "parent_span_id"}, {&G.s_start, "start_ns"}, {&G.s_end, "end_ns"},
               {&G.s_attributes, "attributes"}, {&G.s_shared, "shared"}, {&G.s_error, "error"},
               {&G.s_events, "events"}, {&G.s_links, "links"}, {&G.s_sampled, "sampled"}, {&G.s_remote, "remote_parent"}};
  for (auto& nm : names) {  // each kept once made: a setup that failed part-way is completed by the next
    if (*nm.slot == nullptr && (*nm.slot = PyUnicode_InternFromString(nm.text)) == nullptr) return nullptr;
  }
  if (G.sixty_four == nullptr && (G.sixty_four = PyLong_FromLong(64)) == nullptr) return nullptr;
  if (G.nine == nullptr && (G.nine = PyLong_FromLong(9)) == nullptr) return nullptr;  // Span.attributes: block_pb's field
  G.ready = true;
  Py_RETURN_NONE;
}

PyMethodDef kMethods[] = {
    {"encode_setup", &setup, METH_O, "encode_setup(dict): the Python encoders and caches the native ones use (otlp.use_native)."},
    {"span_json", &span_json, METH_O, "span_json(span): otlp.span_json's string."},
    {"span_pb", &span_pb, METH_O, "span_pb(span): otlp.span_pb's bytes."},
    {"double_repr", &double_repr, METH_O, "double_repr(x): repr(x) of a finite float, as the encoders write it."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

int add_to(PyObject* module) { return PyModule_AddFunctions(module, kMethods); }

}  // namespace otel_encode
