// Jupyter's wire protocol for the kernel (embed/kernel.cpp): a message as
// ZeroMQ frames (identities, <IDS|MSG>, the HMAC-SHA256 signature, header,
// parent header, metadata, content), signed on the way out; on the way in its
// signature checked, each signature taken once per session (a replay is
// dropped, as ipykernel drops a "Duplicate Signature"), and its parts checked
// for the types the protocol gives them. The connection file's values are
// read here too, each checked. No Lua here.
#pragma once
#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_set>
#include <vector>

namespace anatomy::kernel {

using json = nlohmann::json;

/// One message received: who sent it, its four parts, its type, and why it
/// cannot be handled ("" when it can: a problem is answered with an error reply).
struct Message {
  std::vector<std::string> identities;
  json header, parent, metadata, content;
  std::string type;     ///< header.msg_type
  std::string problem;  ///< why it cannot be handled ("" when it can)
};

/// A request field of the wrong type (what() names the request, the field and both types).
struct Malformed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A random UUID (version 4), as message and session ids.
std::string uuid();
/// The time now as ISO 8601 with microseconds, UTC (a header's date).
std::string now_iso8601();
/// "a string (\"yes\")": a JSON value's type and, shortened, the value.
std::string described(const json& v);
/// obj[name] as a bool, or fallback when absent (or null); throws Malformed
/// when it is another type. where: "shutdown_request: content".
bool flag(const json& obj, const std::string& where, const char* name, bool fallback);
/// The reply type of a request type ("execute_request" -> "execute_reply"); "" for a type that is no request.
std::string reply_type_of(const std::string& type);
/// {status: error, ename, evalue, traceback: [evalue]}
json error_reply(const std::string& ename, const std::string& evalue);

/// conn[name] as a string, or fallback when absent; an error naming the key and the value otherwise.
std::string connection_text(const json& conn, const std::string& where, const char* name, const std::string& fallback);
/// conn[name] as a TCP port: an integer in 1..65535 (0, "any", is refused:
/// the kernel does not choose ports and write them back).
int connection_port(const json& conn, const std::string& where, const char* name);

/// Signs and sends, receives and checks, with one key and one session.
class Wire {
 public:
  /// key: the connection file's; empty: messages are neither signed nor checked.
  explicit Wire(std::string key);
  bool signs() const { return !key_.empty(); }
  const std::string& session() const { return session_; }
  /// Sends one message (a new header of msg_type, parent, empty metadata, content) to identities.
  void send(zmq::socket_t& s, const std::vector<std::string>& identities, const std::string& msg_type,
            const json& content, const json& parent);
  /// One multipart message from channel ("shell", "control", "stdin"); false
  /// (and a line on stderr) when it is dropped: not a message, a wrong
  /// signature, a signature seen before (a replay), or a header that names no
  /// request to answer. A message with a problem in its other parts comes
  /// back with m.problem set, for an error reply.
  bool receive(zmq::socket_t& s, const char* channel, Message& m);

 private:
  std::string sign(const std::vector<std::string>& parts) const;
  bool first_seen(const std::string& signature);

  std::string key_, session_;
  std::mutex seen_mu_;
  std::unordered_set<std::string> seen_;  ///< the signatures taken this session (shell, control, stdin)
};

}  // namespace anatomy::kernel
