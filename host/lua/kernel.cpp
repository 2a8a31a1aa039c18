// The Jupyter kernel (see kernel.h): five ZeroMQ sockets, signed multipart
// messages, and a loop that hands each shell request to Lua.
//
// Threads: the main thread serves shell (and runs the cells: Lua is
// single-threaded); a heartbeat thread echoes; a control thread answers
// interrupt_request (a SIGINT to this process, which the Lua state's Ctrl-C
// handling turns into an "interrupted" error at the next instruction),
// shutdown_request and kernel_info_request while a cell runs. iopub is
// shared under a mutex.
#include "host/lua/kernel.h"

#include <lua.hpp>
#include <nlohmann/json.hpp>
#include <openssl/hmac.h>
#include <zmq.hpp>

#include "bindings/interrupt.h"
#include "host/lua/state.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>
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
};

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
  Kernel(const json& conn)
      : ctx_(1),
        shell_(ctx_, zmq::socket_type::router),
        control_(ctx_, zmq::socket_type::router),
        stdin_(ctx_, zmq::socket_type::router),
        iopub_(ctx_, zmq::socket_type::pub),
        hb_(ctx_, zmq::socket_type::rep),
        session_(uuid()) {
    key_ = conn.value("key", "");
    std::string scheme = conn.value("signature_scheme", "hmac-sha256");
    if (!key_.empty() && scheme != "hmac-sha256")
      throw std::runtime_error("anatomy --kernel: signature scheme '" + scheme + "' is not supported (hmac-sha256 is)");
    std::string base = conn.value("transport", "tcp") + "://" + conn.value("ip", "127.0.0.1") + ":";
    auto bind = [&](zmq::socket_t& s, const char* name) {
      if (!conn.contains(name)) throw std::runtime_error(std::string("anatomy --kernel: the connection file has no ") + name);
      std::string where = base + std::to_string(conn[name].get<int>());
      try {
        s.bind(where);
      } catch (const zmq::error_t& e) {
        throw std::runtime_error("anatomy --kernel: cannot bind " + std::string(name) + " to " + where + ": " + e.what());
      }
    };
    bind(shell_, "shell_port");
    bind(control_, "control_port");
    bind(stdin_, "stdin_port");
    bind(iopub_, "iopub_port");
    bind(hb_, "hb_port");
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

  // One multipart message; false when its signature does not match.
  bool receive(zmq::socket_t& s, Message& m) {
    std::vector<std::string> frames;
    for (;;) {
      zmq::message_t part;
      if (!s.recv(part)) return false;
      frames.emplace_back(part.to_string());
      if (!part.more()) break;
    }
    size_t delim = 0;
    while (delim < frames.size() && frames[delim] != "<IDS|MSG>") ++delim;
    if (frames.size() < delim + 6) return false;  // delimiter, signature, header, parent, metadata, content
    m.identities.assign(frames.begin(), frames.begin() + delim);
    std::vector<std::string> parts(frames.begin() + delim + 2, frames.begin() + delim + 6);
    if (!key_.empty() && sign(parts) != frames[delim + 1]) {
      std::fprintf(stderr, "anatomy --kernel: a message with a wrong signature was dropped\n");
      return false;
    }
    try {
      m.header = json::parse(parts[0]);
      m.parent = json::parse(parts[1]);
      m.metadata = json::parse(parts[2]);
      m.content = json::parse(parts[3]);
    } catch (const json::exception&) {
      return false;
    }
    return true;
  }

  void control_loop();
  bool answer(LuaState& state, const Message& m, bool aborting);
  std::vector<Message> take_queued();

  zmq::context_t ctx_;
  zmq::socket_t shell_, control_, stdin_, iopub_, hb_;
  std::string key_, session_;
  std::mutex iopub_mu_;
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
    if (!receive(stdin_, m) || m.header.value("msg_type", "") != "input_reply") continue;
    value = m.content.value("value", "");
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
    std::string reply = type.size() > 8 && type.compare(type.size() - 8, 8, "_request") == 0 ? type.substr(0, type.size() - 8) + "_reply" : "";
    out = {reply, {{"status", "error"}, {"ename", "KernelError"}, {"evalue", state.error()}, {"traceback", json::array({state.error()})}}};
  } else if (lua_isstring(L, -2)) {
    out.first = lua_tostring(L, -2);
    try {
      out.second = json::parse(lua_tostring(L, -1));
    } catch (const json::exception& e) {
      out.second = {{"status", "error"}, {"ename", "KernelError"}, {"evalue", e.what()}, {"traceback", json::array()}};
    }
  }
  lua_settop(L, top);
  return out;
}

void Kernel::control_loop() {
  for (;;) {
    Message m;
    try {
      if (!receive(control_, m)) continue;
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      return;
    }
    std::string type = m.header.value("msg_type", "");
    publish("status", {{"execution_state", "busy"}}, m.header);
    if (type == "interrupt_request") {
      ::kill(::getpid(), SIGINT);
      send(control_, m.identities, "interrupt_reply", {{"status", "ok"}}, m.header);
    } else if (type == "shutdown_request") {
      bool restart = m.content.value("restart", false);
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
      receive(stdin_, ignored);
    }
    if (!(items[0].revents & ZMQ_POLLIN)) continue;
    Message m;
    if (!receive(shell_, m)) continue;
    if (!answer(state, m, false)) return 0;
  }
}

// One shell request: busy, the reply, idle. False after a shutdown_request.
// aborting: a request queued behind a cell that failed (Run All); an
// execute_request is then answered "aborted" without running, as ipykernel does.
bool Kernel::answer(LuaState& state, const Message& m, bool aborting) {
  std::string type = m.header.value("msg_type", "");
  current_parent_ = m.header;
  current_identities_ = m.identities;
  publish("status", {{"execution_state", "busy"}}, m.header);
  if (type == "shutdown_request") {  // some clients send it on shell
    bool restart = m.content.value("restart", false);
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
  if (type == "execute_request" && reply.value("status", "") == "error" && m.content.value("stop_on_error", true) &&
      !aborting)
    queued = take_queued();
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
    if (receive(shell_, m)) out.push_back(std::move(m));
  }
}

}  // namespace

int run_kernel(LuaState& state, const std::string& connection_file) {
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
  kernel = new Kernel(conn);
  return kernel->serve(state);
}

}  // namespace anatomy
