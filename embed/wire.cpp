// Jupyter's wire protocol (see wire.h).
#include "embed/wire.h"

#include <openssl/crypto.h>
#include <openssl/hmac.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <random>

namespace anatomy::kernel {

std::string uuid() {
  static std::mt19937_64 rng{std::random_device{}()};
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  char buf[40];
  uint64_t a = rng(), b = rng();
  std::snprintf(buf, sizeof buf, "%08x-%04x-4%03x-%04x-%012llx", static_cast<unsigned>(a >> 32),
                static_cast<unsigned>((a >> 16) & 0xffff), static_cast<unsigned>(a & 0xfff),
                static_cast<unsigned>(0x8000 | (b >> 48 & 0x3fff)), static_cast<unsigned long long>(b & 0xffffffffffffULL));
  return buf;
}

std::string now_iso8601() {
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() % 1000000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<long long>(us));
  return buf;
}

std::string described(const json& v) {
  std::string type = v.type_name();
  std::string text = v.dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  bool vowel = std::strchr("aeiou", type[0]) != nullptr;
  return std::string(vowel ? "an " : "a ") + type + " (" + text + ")";
}

// obj[name] as a bool, or fallback when absent (or null); throws Malformed
// when it is another type. where: "shutdown_request: content".
bool flag(const json& obj, const std::string& where, const char* name, bool fallback) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) throw Malformed(where + "." + name + " must be a boolean, not " + described(*it));
  return it->get<bool>();
}

// The reply type of a request type ("execute_request" -> "execute_reply");
// "" for a type that is no request.
std::string reply_type_of(const std::string& type) {
  const std::string suffix = "_request";
  if (type.size() <= suffix.size() || type.compare(type.size() - suffix.size(), suffix.size(), suffix) != 0) return "";
  return type.substr(0, type.size() - suffix.size()) + "_reply";
}

json error_reply(const std::string& ename, const std::string& evalue) {
  return {{"status", "error"}, {"ename", ename}, {"evalue", evalue}, {"traceback", json::array({evalue})}};
}

// conn[name] as a string, or fallback when absent
std::string connection_text(const json& conn, const std::string& where, const char* name, const std::string& fallback) {
  auto it = conn.find(name);
  if (it == conn.end()) return fallback;
  if (!it->is_string()) throw std::runtime_error(where + ": " + name + " must be a string, not " + described(*it));
  return it->get<std::string>();
}

// conn[name] as a TCP port: an integer in 1..65535. Port 0 ("any") is
// refused: the kernel does not choose ports and write them back, so its
// client could not find it.
int connection_port(const json& conn, const std::string& where, const char* name) {
  auto it = conn.find(name);
  if (it == conn.end()) throw std::runtime_error(where + " has no " + name);
  if (it->is_number_unsigned() && it->get<uint64_t>() >= 1 && it->get<uint64_t>() <= 65535)
    return static_cast<int>(it->get<uint64_t>());
  std::string why = it->is_number_unsigned() && it->get<uint64_t>() == 0
                        ? " (0 asks the kernel to choose a port, which it does not: the client must write the port)"
                        : "";
  throw std::runtime_error(where + ": " + name + " must be a port (an integer in 1..65535), not " + described(*it) + why);
}

Wire::Wire(std::string key) : key_(std::move(key)), session_(uuid()) {}

std::string Wire::sign(const std::vector<std::string>& parts) const {
  if (key_.empty()) return "";
  std::string data;
  for (const auto& p : parts) data += p;
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  HMAC(EVP_sha256(), key_.data(), static_cast<int>(key_.size()), reinterpret_cast<const unsigned char*>(data.data()),
       data.size(), mac, &n);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < n; ++i) {
    out += hex[mac[i] >> 4];
    out += hex[mac[i] & 15];
  }
  return out;
}

void Wire::send(zmq::socket_t& s, const std::vector<std::string>& identities, const std::string& msg_type,
          const json& content, const json& parent) {
  json header = {{"msg_id", uuid()}, {"session", session_}, {"username", "anatomy"}, {"date", now_iso8601()},
                 {"msg_type", msg_type}, {"version", "5.3"}};
  std::vector<std::string> parts = {header.dump(), parent.is_null() ? "{}" : parent.dump(), "{}", content.dump()};
  for (const auto& id : identities) s.send(zmq::buffer(id), zmq::send_flags::sndmore);
  s.send(zmq::str_buffer("<IDS|MSG>"), zmq::send_flags::sndmore);
  s.send(zmq::buffer(sign(parts)), zmq::send_flags::sndmore);
  for (size_t i = 0; i < parts.size(); ++i)
    s.send(zmq::buffer(parts[i]), i + 1 < parts.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
}

// One multipart message from channel ("shell", "control", "stdin"); false
// (and a line on stderr) when it is dropped: not a message, a wrong
// signature, a signature seen before (a replay), or a header that names no
// request to answer. A message with a problem in its other parts comes back
// with m.problem set, for an error reply.
bool Wire::receive(zmq::socket_t& s, const char* channel, Message& m) {
  std::vector<std::string> frames;
  for (;;) {
    zmq::message_t part;
    if (!s.recv(part)) return false;
    frames.emplace_back(part.to_string());
    if (!part.more()) break;
  }
  size_t delim = 0;
  while (delim < frames.size() && frames[delim] != "<IDS|MSG>") ++delim;
  if (frames.size() < delim + 6) {  // delimiter, signature, header, parent, metadata, content
    std::fprintf(stderr,
                 "anatomy --kernel: %s: a message was dropped: %zu frames after its identities, not the 6 of a "
                 "message (<IDS|MSG>, signature, header, parent_header, metadata, content)%s\n",
                 channel, frames.size() - delim,
                 delim == frames.size() ? "; it has no <IDS|MSG> delimiter" : "");
    return false;
  }
  m.identities.assign(frames.begin(), frames.begin() + delim);
  std::vector<std::string> parts(frames.begin() + delim + 2, frames.begin() + delim + 6);
  const std::string& signature = frames[delim + 1];
  if (!key_.empty()) {
    std::string expected = sign(parts);
    if (signature.size() != expected.size() ||
        CRYPTO_memcmp(signature.data(), expected.data(), expected.size()) != 0) {
      std::fprintf(stderr, "anatomy --kernel: %s: a message with a wrong signature was dropped\n", channel);
      return false;
    }
    if (!first_seen(signature)) {
      std::fprintf(stderr, "anatomy --kernel: %s: Duplicate Signature %s: a replayed message was dropped\n", channel,
                   signature.c_str());
      return false;
    }
  }
  // the header: without an object with a msg_type, no reply can be addressed
  try {
    m.header = json::parse(parts[0]);
  } catch (const json::exception& e) {
    std::fprintf(stderr, "anatomy --kernel: %s: a message was dropped: its header is not JSON (%s)\n", channel, e.what());
    return false;
  }
  if (!m.header.is_object()) {
    std::fprintf(stderr, "anatomy --kernel: %s: a message was dropped: its header is %s, not an object\n", channel,
                 described(m.header).c_str());
    return false;
  }
  auto type = m.header.find("msg_type");
  if (type == m.header.end() || !type->is_string()) {
    std::fprintf(stderr, "anatomy --kernel: %s: a message was dropped: its header.msg_type is %s, not a string\n",
                 channel, type == m.header.end() ? "missing" : described(*type).c_str());
    return false;
  }
  m.type = type->get<std::string>();
  const char* names[] = {"parent_header", "metadata", "content"};
  json* values[] = {&m.parent, &m.metadata, &m.content};
  for (int i = 0; i < 3; ++i) {
    try {
      *values[i] = json::parse(parts[i + 1]);
    } catch (const json::exception& e) {
      m.problem = m.type + ": " + names[i] + " is not JSON (" + e.what() + ")";
    }
    if (m.problem.empty() && !values[i]->is_object())
      m.problem = m.type + ": " + names[i] + " must be an object, not " + described(*values[i]);
    if (!m.problem.empty()) break;
  }
  if (!m.problem.empty()) m.parent = m.metadata = m.content = json::object();
  return true;
}

// True the first time a (verified) signature is seen in this session.
bool Wire::first_seen(const std::string& signature) {
  std::lock_guard<std::mutex> lock(seen_mu_);
  return seen_.insert(signature).second;
}

}  // namespace anatomy::kernel
