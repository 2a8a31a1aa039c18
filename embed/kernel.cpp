// The Jupyter kernel (see kernel.h): five ZeroMQ sockets, signed multipart
// messages, and a loop that hands each shell request to Lua.
//
// Threads: the main thread serves shell (and runs the cells: Lua is
// single-threaded); a heartbeat thread echoes; a control thread answers
// interrupt_request (a SIGINT to this process, which the Lua state's Ctrl-C
// handling turns into an "interrupted" error at the next instruction),
// shutdown_request and kernel_info_request while a cell runs. iopub is
// shared under a mutex.
//
// Hostile input: a message is taken once (its signature is checked, then
// remembered: a replayed message is dropped, as ipykernel drops a "Duplicate
// Signature"); a message whose parts are not what the protocol says is
// answered with an error reply (ename MalformedMessage) where its header
// names a request, else logged to stderr, and the kernel goes on.
#include "embed/kernel.h"

#include <lua.hpp>
#include <nlohmann/json.hpp>
#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <zmq.hpp>

#include "bindings/interrupt.h"
#include "host/io/digest.h"
#include "embed/state.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>
#include <unordered_set>
#include <vector>

namespace anatomy {
namespace {

using json = nlohmann::json;

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

struct Message {
  std::vector<std::string> identities;
  json header, parent, metadata, content;
  std::string type;     // header.msg_type
  std::string problem;  // why it cannot be handled ("" when it can): answered with an error reply
};

// A request field of the wrong type (what() names the request, the field and both types).
struct Malformed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// "a string (\"yes\")": a JSON value's type and, shortened, the value.
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

// zmq::poll; false when a signal cut the wait short (EINTR: Ctrl-C or an
// interrupt_request), so that the caller looks at what the signal changed.
bool wait(zmq::pollitem_t* items, size_t n, std::chrono::milliseconds timeout) {
  try {
    zmq::poll(items, n, timeout);
    return true;
  } catch (const zmq::error_t& e) {
    if (e.num() != EINTR) throw;
    return false;
  }
}

class Kernel {
 public:
  Kernel(const json& conn, const std::string& file)
      : ctx_(1),
        shell_(ctx_, zmq::socket_type::router),
        control_(ctx_, zmq::socket_type::router),
        stdin_(ctx_, zmq::socket_type::router),
        iopub_(ctx_, zmq::socket_type::pub),
        hb_(ctx_, zmq::socket_type::rep),
        session_(uuid()) {
    std::string where = "anatomy --kernel: the connection file " + file;
    if (!conn.is_object()) throw std::runtime_error(where + " holds " + described(conn) + ", not an object");
    key_ = text(conn, where, "key", "");
    std::string scheme = text(conn, where, "signature_scheme", "hmac-sha256");
    if (!key_.empty() && scheme != "hmac-sha256")
      throw std::runtime_error("anatomy --kernel: signature scheme '" + scheme + "' is not supported (hmac-sha256 is)");
    std::string base = text(conn, where, "transport", "tcp") + "://" + text(conn, where, "ip", "127.0.0.1") + ":";
    // every port checked before any socket is bound
    const char* names[] = {"shell_port", "control_port", "stdin_port", "iopub_port", "hb_port"};
    zmq::socket_t* sockets[] = {&shell_, &control_, &stdin_, &iopub_, &hb_};
    int ports[5];
    for (int i = 0; i < 5; ++i) ports[i] = port(conn, where, names[i]);
    for (int i = 0; i < 5; ++i) {
      std::string at = base + std::to_string(ports[i]);
      try {
        sockets[i]->bind(at);
      } catch (const zmq::error_t& e) {
        throw std::runtime_error("anatomy --kernel: cannot bind " + std::string(names[i]) + " to " + at + ": " + e.what());
      }
    }
  }

  int serve(LuaState& state);

  // iopub, from Lua (during a request) or the control thread
  void publish(const std::string& msg_type, const json& content, const json& parent) {
    std::lock_guard<std::mutex> lock(iopub_mu_);
    send(iopub_, {msg_type}, msg_type, content, parent);
  }
  const json& parent() const { return current_parent_; }

  // input_request on stdin to the client of the request being answered, and
  // its input_reply's value. False when Ctrl-C (or an interrupt_request) came
  // first: the caller raises "interrupted".
  bool input(const std::string& prompt, bool password, std::string& value);

 private:
  // conn[name] as a string, or fallback when absent
  static std::string text(const json& conn, const std::string& where, const char* name, const std::string& fallback) {
    auto it = conn.find(name);
    if (it == conn.end()) return fallback;
    if (!it->is_string()) throw std::runtime_error(where + ": " + name + " must be a string, not " + described(*it));
    return it->get<std::string>();
  }

  // conn[name] as a TCP port: an integer in 1..65535. Port 0 ("any") is
  // refused: the kernel does not choose ports and write them back, so its
  // client could not find it.
  static int port(const json& conn, const std::string& where, const char* name) {
    auto it = conn.find(name);
    if (it == conn.end()) throw std::runtime_error(where + " has no " + name);
    if (it->is_number_unsigned() && it->get<uint64_t>() >= 1 && it->get<uint64_t>() <= 65535)
      return static_cast<int>(it->get<uint64_t>());
    std::string why = it->is_number_unsigned() && it->get<uint64_t>() == 0
                          ? " (0 asks the kernel to choose a port, which it does not: the client must write the port)"
                          : "";
    throw std::runtime_error(where + ": " + name + " must be a port (an integer in 1..65535), not " + described(*it) + why);
  }

  std::string sign(const std::vector<std::string>& parts) const {
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

  void send(zmq::socket_t& s, const std::vector<std::string>& identities, const std::string& msg_type,
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
  bool receive(zmq::socket_t& s, const char* channel, Message& m) {
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
  bool first_seen(const std::string& signature) {
    std::lock_guard<std::mutex> lock(seen_mu_);
    return seen_.insert(signature).second;
  }

  // Answers a request that cannot be handled (why: problem) with an error
  // reply, on the socket it came from; logs it to stderr either way.
  void refuse(zmq::socket_t& s, const char* channel, const Message& m, const std::string& problem) {
    std::fprintf(stderr, "anatomy --kernel: %s: %s\n", channel, problem.c_str());
    std::string reply = reply_type_of(m.type);
    if (reply.empty()) return;  // not a request: nothing to answer
    publish("status", {{"execution_state", "busy"}}, m.header);
    send(s, m.identities, reply, error_reply("MalformedMessage", problem), m.header);
    publish("status", {{"execution_state", "idle"}}, m.header);
  }

  void control_loop();
  void control(const Message& m);
  bool answer(LuaState& state, const Message& m, bool aborting);
  std::vector<Message> take_queued();

  zmq::context_t ctx_;
  zmq::socket_t shell_, control_, stdin_, iopub_, hb_;
  std::string key_, session_;
  std::mutex iopub_mu_;
  std::mutex seen_mu_;
  std::unordered_set<std::string> seen_;  // the signatures taken this session (shell, control, stdin)
  json current_parent_ = json::object();
  std::vector<std::string> current_identities_;  // the shell request's sender: stdin messages go to it
  json kernel_info_;  // the reply, made by Lua at start (the control thread cannot call Lua)
};

// send_fn(msg_type, content_json): publishes on iopub for the request being answered
int lua_publish(lua_State* L) {
  auto* k = static_cast<Kernel*>(lua_touserdata(L, lua_upvalueindex(1)));
  const char* type = luaL_checkstring(L, 1);
  const char* content = luaL_checkstring(L, 2);
  json c;
  try {
    c = json::parse(content);
  } catch (const json::exception& e) {
    return luaL_error(L, "kernel: not JSON: %s", e.what());
  }
  k->publish(type, c, k->parent());
  return 0;
}

bool Kernel::input(const std::string& prompt, bool password, std::string& value) {
  send(stdin_, current_identities_, "input_request", {{"prompt", prompt}, {"password", password}}, current_parent_);
  zmq::pollitem_t item{stdin_.handle(), 0, ZMQ_POLLIN, 0};
  for (;;) {
    if (lua::interrupt::pending) return false;
    if (!wait(&item, 1, std::chrono::milliseconds(100)) || !(item.revents & ZMQ_POLLIN)) continue;
    Message m;
    if (!receive(stdin_, "stdin", m)) continue;
    if (!m.problem.empty()) throw Malformed(m.problem);
    if (m.type != "input_reply") {
      std::fprintf(stderr, "anatomy --kernel: stdin: a '%s' was dropped (io.read waits for an input_reply)\n",
                   m.type.c_str());
      continue;
    }
    auto v = m.content.find("value");
    if (v == m.content.end() || !v->is_string())
      throw Malformed("input_reply: content.value must be a string, not " +
                      (v == m.content.end() ? std::string("missing") : described(*v)));
    value = v->get<std::string>();
    return true;
  }
}

// input_fn(prompt, password) -> the line the user typed; raises "interrupted"
// when the cell is interrupted while it waits.
int lua_input(lua_State* L) {
  auto* k = static_cast<Kernel*>(lua_touserdata(L, lua_upvalueindex(1)));
  const char* prompt = luaL_optstring(L, 1, "");
  bool password = lua_toboolean(L, 2);
  std::string value, failure;
  bool got = false;
  try {
    got = k->input(prompt, password, value);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  if (!failure.empty()) return luaL_error(L, "io.read: the notebook's input channel failed: %s", failure.c_str());
  if (!got) return lua::interrupt::raise_in(L);  // as the SIGINT handler's hook would, one instruction later
  lua_pushlstring(L, value.data(), value.size());
  return 1;
}

// Hands a request to lua/anatomy/session/kernel.lua; returns {reply type, reply content}.
std::pair<std::string, json> call_lua(LuaState& state, Kernel& k, const std::string& type, const json& content) {
  lua_State* L = state.get();
  int top = lua_gettop(L);
  lua_getglobal(L, "require");
  lua_pushliteral(L, "anatomy.session.kernel");
  if (!state.call(1, 1)) {
    lua_settop(L, top);
    return {"", {{"status", "error"}, {"ename", "KernelError"}, {"evalue", state.error()}, {"traceback", json::array()}}};
  }
  lua_getfield(L, -1, "handle");
  lua_pushstring(L, type.c_str());
  std::string text = content.dump();
  lua_pushlstring(L, text.data(), text.size());
  lua_pushlightuserdata(L, &k);
  lua_pushcclosure(L, lua_publish, 1);
  lua_pushlightuserdata(L, &k);
  lua_pushcclosure(L, lua_input, 1);
  std::pair<std::string, json> out;
  if (!state.call(4, 2)) {
    out = {reply_type_of(type), {{"status", "error"}, {"ename", "KernelError"}, {"evalue", state.error()},
                                 {"traceback", json::array({state.error()})}}};
  } else if (lua_isstring(L, -2)) {
    out.first = lua_tostring(L, -2);
    try {
      out.second = json::parse(lua_tostring(L, -1));
    } catch (const json::exception& e) {
      out.second = error_reply("KernelError", e.what());
    }
  }
  lua_settop(L, top);
  return out;
}

void Kernel::control_loop() {
  for (;;) {
    Message m;
    try {
      if (!receive(control_, "control", m)) continue;
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      std::fprintf(stderr, "anatomy --kernel: control: the channel failed, it answers no more requests: %s\n", e.what());
      return;
    }
    try {
      control(m);
    } catch (const std::exception& e) {  // a request that failed must not end the kernel
      std::fprintf(stderr, "anatomy --kernel: control: '%s' failed: %s\n", m.type.c_str(), e.what());
    }
  }
}

// One control request: busy, the reply, idle.
void Kernel::control(const Message& m) {
  if (!m.problem.empty()) return refuse(control_, "control", m, m.problem);
  const std::string& type = m.type;
  bool restart = false;
  if (type == "shutdown_request") {
    try {
      restart = flag(m.content, type + ": content", "restart", false);
    } catch (const Malformed& e) {
      return refuse(control_, "control", m, e.what());
    }
  }
  publish("status", {{"execution_state", "busy"}}, m.header);
  if (type == "interrupt_request") {
    ::kill(::getpid(), SIGINT);
    send(control_, m.identities, "interrupt_reply", {{"status", "ok"}}, m.header);
  } else if (type == "shutdown_request") {
    send(control_, m.identities, "shutdown_reply", {{"status", "ok"}, {"restart", restart}}, m.header);
    publish("status", {{"execution_state", "idle"}}, m.header);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let the replies leave
    std::fflush(nullptr);
    std::_Exit(0);
  } else if (type == "kernel_info_request") {
    send(control_, m.identities, "kernel_info_reply", kernel_info_, m.header);
  } else {
    std::fprintf(stderr, "anatomy --kernel: control request '%s' is not supported\n", type.c_str());
  }
  publish("status", {{"execution_state", "idle"}}, m.header);
}

int Kernel::serve(LuaState& state) {
  lua::interrupt::watch_prompt();  // between cells, Ctrl-C (an interrupt) only marks a flag
  {
    lua_State* L = state.get();
    lua_getglobal(L, "require");
    lua_pushliteral(L, "anatomy.session.kernel");
    if (!state.call(1, 1)) throw std::runtime_error("anatomy --kernel: " + state.error());
    lua_getfield(L, -1, "install");
    if (!state.call(0, 0)) throw std::runtime_error("anatomy --kernel: " + state.error());
    lua_pop(L, 1);
  }
  kernel_info_ = call_lua(state, *this, "kernel_info_request", json::object()).second;
  std::thread([this] {
    try {
      zmq::proxy(hb_, hb_);
    } catch (const zmq::error_t&) {
    }
  }).detach();
  std::thread([this] { control_loop(); }).detach();
  publish("status", {{"execution_state", "starting"}}, json::object());

  zmq::pollitem_t items[] = {{shell_.handle(), 0, ZMQ_POLLIN, 0}, {stdin_.handle(), 0, ZMQ_POLLIN, 0}};
  for (;;) {
    if (!wait(items, 2, std::chrono::milliseconds(-1))) {
      lua::interrupt::take_prompt();  // an interrupt while idle: nothing runs
      continue;
    }
    if (items[1].revents & ZMQ_POLLIN) {  // input_reply we did not ask for
      Message ignored;
      if (receive(stdin_, "stdin", ignored))
        std::fprintf(stderr, "anatomy --kernel: stdin: a '%s' that no io.read waits for was dropped\n",
                     ignored.type.c_str());
    }
    if (!(items[0].revents & ZMQ_POLLIN)) continue;
    Message m;
    if (!receive(shell_, "shell", m)) continue;
    try {
      if (!answer(state, m, false)) return 0;
    } catch (const std::exception& e) {  // a request that failed must not end the kernel
      std::fprintf(stderr, "anatomy --kernel: shell: '%s' failed: %s\n", m.type.c_str(), e.what());
    }
  }
}

// One shell request: busy, the reply, idle. False after a shutdown_request.
// aborting: a request queued behind a cell that failed (Run All); an
// execute_request is then answered "aborted" without running, as ipykernel does.
bool Kernel::answer(LuaState& state, const Message& m, bool aborting) {
  if (!m.problem.empty()) {
    refuse(shell_, "shell", m, m.problem);
    return true;
  }
  const std::string& type = m.type;
  // the fields read here (the rest are kernel.lua's, which checks its own)
  bool restart = false, stop_on_error = true;
  try {
    if (type == "shutdown_request") restart = flag(m.content, type + ": content", "restart", false);
    if (type == "execute_request") stop_on_error = flag(m.content, type + ": content", "stop_on_error", true);
  } catch (const Malformed& e) {
    refuse(shell_, "shell", m, e.what());
    return true;
  }
  current_parent_ = m.header;
  current_identities_ = m.identities;
  publish("status", {{"execution_state", "busy"}}, m.header);
  if (type == "shutdown_request") {  // some clients send it on shell
    send(shell_, m.identities, "shutdown_reply", {{"status", "ok"}, {"restart", restart}}, m.header);
    publish("status", {{"execution_state", "idle"}}, m.header);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return false;
  }
  if (aborting && type == "execute_request") {
    send(shell_, m.identities, "execute_reply", {{"status", "aborted"}}, m.header);
    publish("status", {{"execution_state", "idle"}}, m.header);
    return true;
  }
  lua::interrupt::take_prompt();
  auto [reply_type, reply] = call_lua(state, *this, type, m.content);
  lua::interrupt::take_prompt();  // an interrupt that came after the cell ended
  // A failed cell aborts the requests the client sent before it knew (Run
  // All): those already queued now, taken before its reply leaves, so that a
  // request sent after the reply is never aborted.
  std::vector<Message> queued;
  bool failed = reply.is_object() && reply.contains("status") && reply["status"] == "error";
  if (type == "execute_request" && failed && stop_on_error && !aborting) queued = take_queued();
  if (!reply_type.empty()) {
    send(shell_, m.identities, reply_type, reply, m.header);
  } else {
    std::fprintf(stderr, "anatomy --kernel: shell request '%s' is not supported\n", type.c_str());
  }
  publish("status", {{"execution_state", "idle"}}, m.header);
  for (const Message& q : queued)
    if (!answer(state, q, true)) return false;
  return true;
}

// The shell requests waiting in the socket now.
std::vector<Message> Kernel::take_queued() {
  std::vector<Message> out;
  for (;;) {
    zmq::pollitem_t item{shell_.handle(), 0, ZMQ_POLLIN, 0};
    if (!wait(&item, 1, std::chrono::milliseconds(0))) continue;
    if (!(item.revents & ZMQ_POLLIN)) return out;
    Message m;
    if (receive(shell_, "shell", m)) out.push_back(std::move(m));
  }
}

}  // namespace

int run_kernel(LuaState& state, const std::string& connection_file) {
  // a FIFO there would block the open: anything but a regular file is refused first
  if (std::string why = io::not_a_file(connection_file); !why.empty())
    throw std::runtime_error("anatomy --kernel: the connection file " + connection_file + " " + why);
  std::ifstream f(connection_file);
  if (!f) throw std::runtime_error("anatomy --kernel: cannot read the connection file " + connection_file);
  json conn;
  try {
    conn = json::parse(f);
  } catch (const json::exception& e) {
    throw std::runtime_error("anatomy --kernel: the connection file " + connection_file + " is not JSON: " + e.what());
  }
  // never destroyed: its threads block in ZeroMQ until the process ends
  static Kernel* kernel = nullptr;
  kernel = new Kernel(conn, connection_file);
  return kernel->serve(state);
}

}  // namespace anatomy
