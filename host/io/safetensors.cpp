// safetensors reading and writing (see safetensors.h).
#include "host/io/safetensors.h"
#include "host/io/digest.h"

#include "host/io/durable.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

namespace anatomy::io {
namespace {

using json = nlohmann::json;

struct DtypeName {
  const char* name;
  c10::ScalarType type;
};
const DtypeName kDtypes[] = {
    {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf}, {"BF16", at::kBFloat16},
    {"I64", at::kLong},   {"I32", at::kInt},   {"I16", at::kShort}, {"I8", at::kChar},
    {"U8", at::kByte},    {"BOOL", at::kBool},
};

const char* dtype_code(c10::ScalarType t) {
  for (const auto& d : kDtypes)
    if (d.type == t) return d.name;
  throw SafetensorsError(std::string("dtype ") + c10::toString(t) + " cannot be stored in safetensors");
}

std::string in_quotes(const std::string& s) { return "'" + s + "'"; }

[[noreturn]] void corrupt(const std::string& path, const std::string& why) {
  throw SafetensorsError("'" + path + "' is not a valid safetensors file: " + why);
}

}  // namespace

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> data;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (name == "__metadata__") throw SafetensorsError("'__metadata__' cannot name a tensor");
    if (header.contains(name)) throw SafetensorsError("tensor name " + in_quotes(name) + " appears twice");
    at::Tensor t = tensor.detach().to(at::kCPU).contiguous();
    uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    header[name] = {{"dtype", dtype_code(t.scalar_type())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    data.push_back(t);
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keep the data 8-byte aligned

  uint64_t n = text.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  try {
    write_atomic(path, [&](Sink& sink) {
      sink.write(len, 8);
      sink.write(text.data(), text.size());
      pause_mid_write();  // a test's kill lands here: the file is half written
      for (const at::Tensor& t : data) {
        size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
        if (bytes > 0) sink.write(t.data_ptr(), bytes);
      }
    });
  } catch (const WriteError& e) {
    throw SafetensorsError(e.what());
  }
}

SafetensorsIndex open_safetensors(const std::string& path) {
  if (std::string why = not_a_file(path); !why.empty()) throw SafetensorsError(in_quotes(path) + " " + why);
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw SafetensorsError("cannot open " + in_quotes(path) + ": " + std::strerror(errno));
  const uint64_t size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  if (size < 8) corrupt(path, "it is " + std::to_string(size) + " bytes long, shorter than the 8-byte header length");
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  if (in.gcount() != 8) corrupt(path, "only " + std::to_string(in.gcount()) + " of the 8 bytes of the header length could be read");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(len[i]) << (8 * i);
  if (n > size - 8)
    corrupt(path, "the header length " + std::to_string(n) + " runs past the end of the file (" +
                      std::to_string(size) + " bytes)");
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  if (static_cast<uint64_t>(in.gcount()) != n)
    corrupt(path, "only " + std::to_string(in.gcount()) + " of the header's " + std::to_string(n) + " bytes could be read");
  json header;
  try {
    header = json::parse(text);
  } catch (const json::exception& e) {
    corrupt(path, std::string("the header is not JSON (") + e.what() + ")");
  }
  if (!header.is_object()) corrupt(path, "the header is not a JSON object");

  const uint64_t data_size = size - 8 - n;
  SafetensorsIndex file;
  file.path = path;
  file.data_start = 8 + n;
  using Entry = SafetensorsIndex::Entry;
  std::vector<Entry>& entries = file.entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) corrupt(path, "__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) corrupt(path, "metadata value " + in_quotes(m.key()) + " is not a string");
        file.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      corrupt(path, "tensor " + in_quotes(name) + " lacks dtype, shape or data_offsets");
    Entry e{name, at::kFloat, {}, 0, 0};
    bool known = false;
    if (v["dtype"].is_string())
      for (const auto& d : kDtypes)
        if (v["dtype"] == d.name) e.type = d.type, known = true;
    if (!known) corrupt(path, "tensor " + in_quotes(name) + " has unknown dtype " + v["dtype"].dump());
    if (!v["shape"].is_array()) corrupt(path, "tensor " + in_quotes(name) + " has a shape that is not a list");
    uint64_t numel = 1;
    for (const json& s : v["shape"]) {
      if (!s.is_number_unsigned()) corrupt(path, "tensor " + in_quotes(name) + " has a negative or non-integer size");
      if (s.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(numel, s.get<uint64_t>(), &numel))
        corrupt(path, "tensor " + in_quotes(name) + " has a shape too large to exist: " + v["shape"].dump());
      e.shape.push_back(s.get<int64_t>());
    }
    // the byte count too: [2^62 + 1] of F32 is 2^64 + 4 bytes, which wraps to 4
    uint64_t expected = 0;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(c10::elementSize(e.type)), &expected) ||
        expected > static_cast<uint64_t>(INT64_MAX))
      corrupt(path, "tensor " + in_quotes(name) + " has a shape too large to exist: " + v["shape"].dump() +
                        " of " + v["dtype"].get<std::string>() + " is more than 2^63 bytes");
    const json& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      corrupt(path, "tensor " + in_quotes(name) + " has malformed data_offsets");
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    if (e.begin > e.end || e.end > data_size)
      corrupt(path, "tensor " + in_quotes(name) + " has data_offsets [" + std::to_string(e.begin) + ", " +
                        std::to_string(e.end) + "] outside the " + std::to_string(data_size) + " data bytes");
    if (e.end - e.begin != expected)
      corrupt(path, "tensor " + in_quotes(name) + " of shape " + v["shape"].dump() + " needs " + std::to_string(expected) +
                        " bytes but its data_offsets span " + std::to_string(e.end - e.begin));
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < entries.size(); ++i)
    if (entries[i].begin < entries[i - 1].end)
      corrupt(path, "tensors " + in_quotes(entries[i - 1].name) + " and " + in_quotes(entries[i].name) + " overlap");

  return file;
}

at::Tensor read_tensor(const SafetensorsIndex& index, const SafetensorsIndex::Entry& e) {
  std::ifstream in(index.path, std::ios::binary);
  if (!in) throw SafetensorsError("cannot open " + in_quotes(index.path) + ": " + std::strerror(errno));
  // Booleans are read as bytes: a byte other than 0 or 1 must not become a bool.
  bool is_bool = e.type == at::kBool;
  at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(is_bool ? at::kByte : e.type));
  in.seekg(static_cast<std::streamoff>(index.data_start + e.begin));
  in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(e.end - e.begin));
  if (!in) corrupt(index.path, "the data of tensor " + in_quotes(e.name) + " could not be read");
  return is_bool ? t.ne(0) : t;
}

void read_tensor_into(const SafetensorsIndex& index, const SafetensorsIndex::Entry& e, at::Tensor& out) {
  if (!out.is_cpu() || !out.is_contiguous() || out.scalar_type() != e.type || out.sizes() != at::IntArrayRef(e.shape) ||
      e.type == at::kBool)
    throw SafetensorsError("tensor " + in_quotes(e.name) + " cannot be read in place into a " +
                           std::string(out.is_cpu() ? "" : "non-CPU ") + (out.is_contiguous() ? "" : "non-contiguous ") +
                           "tensor of another dtype or shape");
  std::ifstream in(index.path, std::ios::binary);
  if (!in) throw SafetensorsError("cannot open " + in_quotes(index.path) + ": " + std::strerror(errno));
  in.seekg(static_cast<std::streamoff>(index.data_start + e.begin));
  in.read(static_cast<char*>(out.data_ptr()), static_cast<std::streamsize>(e.end - e.begin));
  if (!in) corrupt(index.path, "the data of tensor " + in_quotes(e.name) + " could not be read");
}

const SafetensorsIndex::Entry* SafetensorsIndex::find(const std::string& name) const {
  for (const auto& e : entries)
    if (e.name == name) return &e;
  return nullptr;
}

SafetensorsFile load_safetensors(const std::string& path) {
  SafetensorsIndex index = open_safetensors(path);
  SafetensorsFile file;
  file.metadata = index.metadata;
  for (const auto& e : index.entries) file.tensors.emplace_back(e.name, read_tensor(index, e));
  return file;
}

}  // namespace anatomy::io
