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
// names a request, else logged to stderr, and the kernel goes on. The
// protocol itself (signing, checking, parsing) is embed/wire.cpp's.
#include "embed/kernel.h"

#include <lua.hpp>
#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include "bindings/interrupt.h"
#include "host/io/digest.h"
#include "embed/state.h"
#include "embed/wire.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

namespace anatomy {
namespace {

using json = nlohmann::json;
using kernel::Message;
using kernel::Malformed;
using kernel::described;
using kernel::error_reply;
using kernel::flag;
using kernel::reply_type_of;

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
        wire_(kernel::connection_text(conn, "anatomy --kernel: the connection file " + file, "key", "")) {
    std::string where = "anatomy --kernel: the connection file " + file;
    std::string scheme = kernel::connection_text(conn, where, "signature_scheme", "hmac-sha256");
    if (wire_.signs() && scheme != "hmac-sha256")
      throw std::runtime_error("anatomy --kernel: signature scheme '" + scheme + "' is not supported (hmac-sha256 is)");
    std::string base = kernel::connection_text(conn, where, "transport", "tcp") + "://" +
                       kernel::connection_text(conn, where, "ip", "127.0.0.1") + ":";
    // every port checked before any socket is bound
    const char* names[] = {"shell_port", "control_port", "stdin_port", "iopub_port", "hb_port"};
    zmq::socket_t* sockets[] = {&shell_, &control_, &stdin_, &iopub_, &hb_};
    int ports[5];
    for (int i = 0; i < 5; ++i) ports[i] = kernel::connection_port(conn, where, names[i]);
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
    wire_.send(iopub_, {msg_type}, msg_type, content, parent);
  }
  const json& parent() const { return current_parent_; }

  // input_request on stdin to the client of the request being answered, and
  // its input_reply's value. False when Ctrl-C (or an interrupt_request) came
  // first: the caller raises "interrupted".
  bool input(const std::string& prompt, bool password, std::string& value);

 private:
  // Answers a request that cannot be handled (why: problem) with an error
  // reply, on the socket it came from; logs it to stderr either way.
  void refuse(zmq::socket_t& s, const char* channel, const Message& m, const std::string& problem) {
    std::fprintf(stderr, "anatomy --kernel: %s: %s\n", channel, problem.c_str());
    std::string reply = reply_type_of(m.type);
    if (reply.empty()) return;  // not a request: nothing to answer
    publish("status", {{"execution_state", "busy"}}, m.header);
    wire_.send(s, m.identities, reply, error_reply("MalformedMessage", problem), m.header);
    publish("status", {{"execution_state", "idle"}}, m.header);
  }

  void control_loop();
  void control(const Message& m);
  bool answer(LuaState& state, const Message& m, bool aborting);
  std::vector<Message> take_queued();

  zmq::context_t ctx_;
  zmq::socket_t shell_, control_, stdin_, iopub_, hb_;
  kernel::Wire wire_;  // signs, checks and parses every message (embed/wire.cpp)
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
  wire_.send(stdin_, current_identities_, "input_request", {{"prompt", prompt}, {"password", password}}, current_parent_);
  zmq::pollitem_t item{stdin_.handle(), 0, ZMQ_POLLIN, 0};
  for (;;) {
    if (lua::interrupt::pending) return false;
    if (!wait(&item, 1, std::chrono::milliseconds(100)) || !(item.revents & ZMQ_POLLIN)) continue;
    Message m;
    if (!wire_.receive(stdin_, "stdin", m)) continue;
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
      if (!wire_.receive(control_, "control", m)) continue;
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
    wire_.send(control_, m.identities, "interrupt_reply", {{"status", "ok"}}, m.header);
  } else if (type == "shutdown_request") {
    wire_.send(control_, m.identities, "shutdown_reply", {{"status", "ok"}, {"restart", restart}}, m.header);
    publish("status", {{"execution_state", "idle"}}, m.header);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let the replies leave
    std::fflush(nullptr);
    std::_Exit(0);
  } else if (type == "kernel_info_request") {
    wire_.send(control_, m.identities, "kernel_info_reply", kernel_info_, m.header);
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
      if (wire_.receive(stdin_, "stdin", ignored))
        std::fprintf(stderr, "anatomy --kernel: stdin: a '%s' that no io.read waits for was dropped\n",
                     ignored.type.c_str());
    }
    if (!(items[0].revents & ZMQ_POLLIN)) continue;
    Message m;
    if (!wire_.receive(shell_, "shell", m)) continue;
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
    wire_.send(shell_, m.identities, "shutdown_reply", {{"status", "ok"}, {"restart", restart}}, m.header);
    publish("status", {{"execution_state", "idle"}}, m.header);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return false;
  }
  if (aborting && type == "execute_request") {
    wire_.send(shell_, m.identities, "execute_reply", {{"status", "aborted"}}, m.header);
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
    wire_.send(shell_, m.identities, reply_type, reply, m.header);
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
    if (wire_.receive(shell_, "shell", m)) out.push_back(std::move(m));
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
