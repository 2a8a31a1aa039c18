// The kernelspec (see kernel.h): kernel.json, and the logo as SVG and as the
// 32 and 64 pixel PNGs that the classic notebook and JupyterLab's launcher show.
#include "embed/kernel.h"

#include <nlohmann/json.hpp>
#include <zlib.h>

#include "host/io/durable.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <stdexcept>

namespace anatomy {
namespace {

using json = nlohmann::json;


const char* kLogo =
    "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"64\" height=\"64\" viewBox=\"0 0 64 64\">"
    "<rect width=\"64\" height=\"64\" rx=\"10\" fill=\"#1f3b57\"/>"
    "<g fill=\"#f2b134\"><rect x=\"12\" y=\"40\" width=\"8\" height=\"14\"/><rect x=\"24\" y=\"30\" width=\"8\" height=\"24\"/>"
    "<rect x=\"36\" y=\"18\" width=\"8\" height=\"36\"/><rect x=\"48\" y=\"10\" width=\"8\" height=\"44\"/></g></svg>\n";

// The logo above drawn at size x size pixels (4 x 4 samples a pixel, so the
// rounded corners are smooth) as a PNG: the classic notebook and JupyterLab's
// launcher show logo-32x32.png and logo-64x64.png.
std::string logo_png(int size) {
  struct Box { double x, y, w, h; };
  const Box bars[] = {{12, 40, 8, 14}, {24, 30, 8, 24}, {36, 18, 8, 36}, {48, 10, 8, 44}};
  const unsigned char ground[3] = {0x1f, 0x3b, 0x57}, bar[3] = {0xf2, 0xb1, 0x34};
  const int ss = 4;
  std::string raw;  // each row: filter type 0, then RGBA
  for (int py = 0; py < size; ++py) {
    raw += '\0';
    for (int px = 0; px < size; ++px) {
      double sum[3] = {0, 0, 0};
      int covered = 0;
      for (int sy = 0; sy < ss; ++sy)
        for (int sx = 0; sx < ss; ++sx) {
          double x = (px + (sx + 0.5) / ss) * 64.0 / size, y = (py + (sy + 0.5) / ss) * 64.0 / size;
          double cx = std::clamp(x, 10.0, 54.0), cy = std::clamp(y, 10.0, 54.0);  // the corners' radius is 10
          if ((x - cx) * (x - cx) + (y - cy) * (y - cy) > 100.0) continue;
          bool on_bar = false;
          for (const Box& b : bars) on_bar = on_bar || (x >= b.x && x < b.x + b.w && y >= b.y && y < b.y + b.h);
          for (int c = 0; c < 3; ++c) sum[c] += on_bar ? bar[c] : ground[c];
          ++covered;
        }
      for (int c = 0; c < 3; ++c) raw += static_cast<char>(covered ? static_cast<int>(sum[c] / covered + 0.5) : 0);
      raw += static_cast<char>(covered * 255 / (ss * ss));
    }
  }
  uLongf packed_size = compressBound(raw.size());
  std::string packed(packed_size, '\0');
  if (compress2(reinterpret_cast<Bytef*>(packed.data()), &packed_size, reinterpret_cast<const Bytef*>(raw.data()),
                raw.size(), 9) != Z_OK)
    throw std::runtime_error("anatomy --install-kernel: zlib could not compress the logo");
  packed.resize(packed_size);
  auto be32 = [](uint32_t v) {
    return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
  };
  auto chunk = [&](const char* type, const std::string& data) {
    std::string body = std::string(type, 4) + data;
    return be32(static_cast<uint32_t>(data.size())) + body +
           be32(static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(body.data()), body.size())));
  };
  std::string header = be32(size) + be32(size) + std::string{8, 6, 0, 0, 0};  // 8 bits, RGBA, deflate, no interlace
  return std::string("\x89PNG\r\n\x1a\n", 8) + chunk("IHDR", header) + chunk("IDAT", packed) + chunk("IEND", "");
}

void make_dirs(const std::string& path) {
  std::string cur;
  std::stringstream ss(path);
  std::string part;
  if (!path.empty() && path[0] == '/') cur = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    cur += part + "/";
    if (::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST)
      throw std::runtime_error("anatomy --install-kernel: cannot create " + cur + ": " + std::strerror(errno));
  }
}

}  // namespace

std::string install_kernelspec(const std::string& executable, bool user, const std::string& prefix) {
  std::string dir;
  if (!prefix.empty()) {
    dir = prefix + "/share/jupyter/kernels/anatomy";
  } else if (user) {
    const char* data = std::getenv("JUPYTER_DATA_DIR");
    const char* home = std::getenv("HOME");
    if (data && *data) dir = std::string(data) + "/kernels/anatomy";
    else dir = std::string(home && *home ? home : ".") + "/.local/share/jupyter/kernels/anatomy";
  } else {
    dir = "/usr/local/share/jupyter/kernels/anatomy";
  }
  make_dirs(dir);
  json spec = {{"argv", {executable, "--kernel", "{connection_file}"}},
               {"display_name", "anatomy (Lua over LibTorch)"},
               {"language", "lua"},
               {"interrupt_mode", "signal"},
               {"metadata", json::object()}};
  std::string text = spec.dump(2) + "\n";
  io::write_atomic(dir + "/kernel.json", text.data(), text.size());
  io::write_atomic(dir + "/logo-svg.svg", kLogo, std::strlen(kLogo));
  for (int size : {32, 64}) {
    std::string png = logo_png(size);
    io::write_atomic(dir + "/logo-" + std::to_string(size) + "x" + std::to_string(size) + ".png", png.data(), png.size());
  }
  return dir;
}

}  // namespace anatomy
