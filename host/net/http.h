// HTTP(S) requests through libcurl, for fetching checkpoints from the
// Hugging Face Hub: one request at a time, redirects never followed (the
// caller decides where a token may go), the body into memory or appended to a
// file (a download continued with a Range request), a progress line on a
// terminal. No Lua here; bindings/http.cpp is the Lua side.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace anatomy::net {

struct HttpRequest {
  std::string method = "GET";        ///< "GET" or "HEAD"
  std::string url;
  std::vector<std::string> headers;  ///< "Name: value" lines, sent as given
  /// When not empty, a 2xx body goes to this file: appended after a 206
  /// answer to a Range request (resume_from >= 0), else written from the start.
  /// It is opened without following a link and must be a regular file (a
  /// link or FIFO planted there is refused). Bodies of other answers (error
  /// messages) stay in memory.
  std::string output;
  int64_t resume_from = -1;          ///< >= 0: ask for bytes resume_from.. (Range)
  double connect_timeout = 10;       ///< seconds to connect
  double stall_timeout = 60;         ///< abort when no byte comes for this long (seconds, whole)
  double max_seconds = 0;            ///< > 0: abort a request that has not ended after this long
  double min_rate = 0;               ///< > 0: abort when, after stall_timeout seconds, the body averages under this many bytes/s
  /// >= 0: the most bytes the body may make (in memory, or the output file
  /// with its part before a continued download); one byte more aborts the
  /// transfer (`too_large`).
  int64_t max_bytes = -1;
  std::string progress;              ///< a label: draw a progress line on stderr (a terminal only)
  int64_t total = -1;                ///< the whole file's size, for the progress line
  std::function<bool()> cancelled;   ///< polled while the transfer runs; true aborts it
};

struct HttpResponse {
  long status = 0;                   ///< 0 when no answer came (see error)
  std::vector<std::pair<std::string, std::string>> headers;  ///< names in lower case
  std::string body;                  ///< the body, unless it went to the output file
  int64_t written = 0;               ///< bytes appended to the output file
  bool appended = false;             ///< the output was continued (a 206 answer)
  std::string error;                 ///< libcurl's reason when the transfer failed ("" when it did not)
  bool cut = false;                  ///< the connection ended before the whole body came
  bool cancelled = false;            ///< stopped by `cancelled`
  bool too_large = false;            ///< stopped at max_bytes: the server sent more
  bool too_slow = false;             ///< stopped by min_rate or max_seconds
};

/// Runs one request. Never throws for network trouble: the answer's `error`
/// says what happened (a refused connection, a timeout, a body cut short);
/// throws std::runtime_error only when the output file cannot be written.
HttpResponse http_request(const HttpRequest& request);

/// The progress line's text: "label  12.0 MB / 48.0 MB  3.1 MB/s  ETA 12s"
/// (no total: no ETA).
std::string progress_line(const std::string& label, int64_t done, int64_t total, double seconds);

}  // namespace anatomy::net
