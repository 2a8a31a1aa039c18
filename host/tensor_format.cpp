// Tensor printing (see tensor_format.h). The layout rules are PyTorch's
// (torch/_tensor_str.py), re-implemented so that a tensor prints the same in
// anatomy as in Python: the same widths, line breaks and summaries.
#include "host/tensor_format.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>

#include <cmath>
#include <cstdio>
#include <sstream>
#include <vector>

namespace anatomy {
namespace {

// Decides how every element of one tensor is written (PyTorch's _Formatter).
class Formatter {
 public:
  explicit Formatter(const at::Tensor& data) {
    const auto& opt = print_options();
    floating_ = at::isFloatingType(data.scalar_type());
    at::Tensor flat = data.reshape({-1}).to(at::kCPU);
    if (!floating_) {
      for (int64_t i = 0; i < flat.numel(); ++i) width_ = std::max(width_, format_raw(flat, i).size());
    } else {
      at::Tensor d = flat.to(at::kDouble);
      at::Tensor vals = d.masked_select(at::isfinite(d) & d.ne(0));
      if (vals.numel() > 0) {
        const double* v = vals.data_ptr<double>();
        double lo = INFINITY, hi = 0;
        for (int64_t i = 0; i < vals.numel(); ++i) {
          lo = std::min(lo, std::fabs(v[i]));
          hi = std::max(hi, std::fabs(v[i]));
          if (v[i] != std::ceil(v[i])) int_mode_ = false;
        }
        if (int_mode_) {
          sci_ = hi / lo > 1000. || hi > 1.e8;
        } else {
          sci_ = hi / lo > 1000. || hi > 1.e8 || lo < 1.e-4;
        }
        if (opt.sci_mode >= 0) sci_ = opt.sci_mode == 1;
        for (int64_t i = 0; i < vals.numel(); ++i) {
          size_t w = sci_ ? fmt("%.*e", opt.precision, v[i]).size()
                          : int_mode_ ? fmt("%.0f", 0, v[i]).size() + 1 : fmt("%.*f", opt.precision, v[i]).size();
          width_ = std::max(width_, w);
        }
      } else if (opt.sci_mode >= 0) {
        sci_ = opt.sci_mode == 1;
      }
    }
  }

  size_t width() const { return width_; }

  // One element of `t` (a CPU tensor), right-aligned to the common width.
  std::string format(const at::Tensor& flat, int64_t i) const {
    std::string s = floating_ ? format_float(flat, i) : format_raw(flat, i);
    if (s.size() < width_) s.insert(0, width_ - s.size(), ' ');
    return s;
  }

 private:
  static std::string fmt(const char* f, int precision, double v) {
    char buf[64];
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    std::snprintf(buf, sizeof buf, f, precision, v);
    return buf;
  }
  std::string format_float(const at::Tensor& flat, int64_t i) const {
    double v = flat[i].item<double>();
    int p = print_options().precision;
    if (sci_) return fmt("%.*e", p, v);
    if (int_mode_) {
      std::string s = fmt("%.*f", 0, v);
      return std::isfinite(v) ? s + "." : s;
    }
    return fmt("%.*f", p, v);
  }
  static std::string format_raw(const at::Tensor& flat, int64_t i) {
    at::Tensor e = flat[i];
    if (e.scalar_type() == at::kBool) return e.item<bool>() ? "True" : "False";
    if (at::isComplexType(e.scalar_type())) return "complex";
    return std::to_string(e.item<int64_t>());
  }

  bool floating_ = false;
  bool int_mode_ = true;
  bool sci_ = false;
  size_t width_ = 1;
};

// The elements PyTorch looks at to choose a format when summarising.
at::Tensor summarized_data(const at::Tensor& t) {
  int64_t e = print_options().edgeitems;
  if (t.dim() == 0) return t;
  if (t.dim() == 1) {
    if (t.size(0) > 2 * e) return at::cat({t.slice(0, 0, e), t.slice(0, t.size(0) - e)});
    return t;
  }
  std::vector<at::Tensor> parts;
  if (t.size(0) > 2 * e) {
    for (int64_t i = 0; i < e; ++i) parts.push_back(summarized_data(t[i]));
    for (int64_t i = t.size(0) - e; i < t.size(0); ++i) parts.push_back(summarized_data(t[i]));
  } else {
    for (int64_t i = 0; i < t.size(0); ++i) parts.push_back(summarized_data(t[i]));
  }
  return at::stack(parts);
}

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += sep;
    out += parts[i];
  }
  return out;
}

std::string vector_str(const at::Tensor& t, size_t indent, bool summarize, const Formatter& f) {
  const auto& opt = print_options();
  size_t element_length = f.width() + 2;
  size_t per_line = std::max<size_t>(1, (opt.linewidth > static_cast<int>(indent) ? opt.linewidth - indent : 0) / element_length);
  std::vector<std::string> data;
  int64_t n = t.size(0), e = opt.edgeitems;
  if (summarize && e == 0) {
    data.push_back("...");
  } else if (summarize && n > 2 * e) {
    for (int64_t i = 0; i < e; ++i) data.push_back(f.format(t, i));
    data.push_back(" ...");
    for (int64_t i = n - e; i < n; ++i) data.push_back(f.format(t, i));
  } else {
    for (int64_t i = 0; i < n; ++i) data.push_back(f.format(t, i));
  }
  std::vector<std::string> lines;
  for (size_t i = 0; i < data.size(); i += per_line) {
    std::vector<std::string> line(data.begin() + i, data.begin() + std::min(data.size(), i + per_line));
    lines.push_back(join(line, ", "));
  }
  return "[" + join(lines, ",\n" + std::string(indent + 1, ' ')) + "]";
}

std::string tensor_str(const at::Tensor& t, size_t indent, bool summarize, const Formatter& f) {
  if (t.dim() == 0) return f.format(t.reshape({1}), 0);
  if (t.dim() == 1) return vector_str(t, indent, summarize, f);
  int64_t n = t.size(0), e = print_options().edgeitems;
  std::vector<std::string> slices;
  if (summarize && n > 2 * e) {
    for (int64_t i = 0; i < e; ++i) slices.push_back(tensor_str(t[i], indent + 1, summarize, f));
    slices.push_back("...");
    for (int64_t i = n - e; i < n; ++i) slices.push_back(tensor_str(t[i], indent + 1, summarize, f));
  } else {
    for (int64_t i = 0; i < n; ++i) slices.push_back(tensor_str(t[i], indent + 1, summarize, f));
  }
  std::string sep = "," + std::string(static_cast<size_t>(t.dim() - 1), '\n') + std::string(indent + 1, ' ');
  return "[" + join(slices, sep) + "]";
}

}  // namespace

PrintOptions& print_options() {
  static PrintOptions options;
  return options;
}

const char* dtype_name(c10::ScalarType type) {
  switch (type) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kLong: return "int64";
    case at::kInt: return "int32";
    case at::kShort: return "int16";
    case at::kChar: return "int8";
    case at::kByte: return "uint8";
    case at::kBool: return "bool";
    case at::kComplexFloat: return "complex64";
    case at::kComplexDouble: return "complex128";
    default: return c10::toString(type);
  }
}

std::string shape_string(at::IntArrayRef sizes) {
  if (sizes.empty()) return "scalar";
  std::string s;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (i) s += "x";
    s += std::to_string(sizes[i]);
  }
  return s;
}

std::string format_tensor_body(const at::Tensor& t) {
  const std::string prefix = "tensor(";
  auto size = [&] {
    std::string s;
    for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
    return "size=(" + s + (t.dim() == 1 ? ",)" : ")");
  };
  // a meta tensor has a shape and a dtype but no values (PyTorch prints it so too)
  if (t.is_meta()) return prefix + "..., " + size() + ")";
  if (t.numel() == 0) {
    if (t.dim() == 1) return prefix + "[])";
    return prefix + "[], " + size() + ")";
  }
  at::Tensor data = t.detach().to(at::kCPU);
  if (data.scalar_type() == at::kHalf || data.scalar_type() == at::kBFloat16) data = data.to(at::kFloat);
  bool summarize = data.numel() > print_options().threshold;
  Formatter f(summarize ? summarized_data(data) : data);
  return prefix + tensor_str(data, prefix.size(), summarize, f) + ")";
}

std::string format_tensor_header(const at::Tensor& t) {
  std::ostringstream os;
  os << "[Tensor " << shape_string(t.sizes()) << " " << dtype_name(t.scalar_type()) << " "
     << (t.device().is_cpu() ? std::string("cpu") : t.device().str());
  if (t.requires_grad()) os << " requires_grad";
  if (t.grad_fn()) os << " grad_fn=" << t.grad_fn()->name();
  os << "]";
  return os.str();
}

std::string format_tensor(const at::Tensor& t) {
  if (!t.defined()) return "[Tensor undefined]";
  return format_tensor_header(t) + "\n" + format_tensor_body(t);
}

}  // namespace anatomy
