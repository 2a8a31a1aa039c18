// HTTP(S) requests through libcurl (see http.h).
#include "host/net/http.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>

namespace anatomy::net {
namespace {

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) throw std::runtime_error("libcurl could not start");
  });
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string size_text(double bytes) {
  char buf[32];
  if (bytes < 1e3) std::snprintf(buf, sizeof buf, "%.0f B", bytes);
  else if (bytes < 1e6) std::snprintf(buf, sizeof buf, "%.1f kB", bytes / 1e3);
  else if (bytes < 1e9) std::snprintf(buf, sizeof buf, "%.1f MB", bytes / 1e6);
  else std::snprintf(buf, sizeof buf, "%.2f GB", bytes / 1e9);
  return buf;
}

struct Transfer {
  Transfer(const HttpRequest* request, HttpResponse* response, CURL* curl) : request(request), response(response), curl(curl) {}
  const HttpRequest* request;
  HttpResponse* response;
  CURL* curl;
  FILE* file = nullptr;
  std::string write_error;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  double last_drawn = -1;
  bool drawn = false;
  bool terminal = isatty(2) != 0;

  ~Transfer() {
    if (file) std::fclose(file);
  }

  // The body of a 2xx answer goes to the output file, opened at its first
  // byte: appended after a 206 (the Range was honoured), from the start after
  // a 200 (the server sent the whole file again).
  // The file is opened without following a link (O_NOFOLLOW) and without
  // blocking (a FIFO), then must be a regular file: a link planted at the
  // output's name cannot send the bytes elsewhere.
  bool open_output() {
    long status = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    bool append = status == 206 && request->resume_from >= 0;
    int flags = O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | (append ? O_APPEND : O_TRUNC);
    int fd = ::open(request->output.c_str(), flags, 0644);
    if (fd < 0) {
      write_error = "cannot write '" + request->output + "': " +
                    (errno == ELOOP ? std::string("it is a symbolic link") : std::string(std::strerror(errno)));
      return false;
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      write_error = "cannot write '" + request->output + "': it is not a regular file";
      return false;
    }
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    file = ::fdopen(fd, append ? "ab" : "wb");
    if (!file) {
      ::close(fd);
      write_error = "cannot write '" + request->output + "': " + std::strerror(errno);
      return false;
    }
    response->appended = append;
    return true;
  }

  // Whether n more bytes stay within max_bytes; past it the transfer stops.
  bool fits(size_t n) {
    int64_t before = response->appended ? request->resume_from : 0;  // a continued file counts its first part
    int64_t have = before + static_cast<int64_t>(response->body.size()) + response->written;
    if (request->max_bytes < 0 || have + static_cast<int64_t>(n) <= request->max_bytes) return true;
    response->too_large = true;
    return false;
  }

  size_t body(const char* data, size_t n) {
    long status = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    if (!fits(n)) return 0;
    if (request->output.empty() || status < 200 || status >= 300) {
      response->body.append(data, n);
      return n;
    }
    if (!file && !open_output()) return 0;
    if (std::fwrite(data, 1, n, file) != n) {
      write_error = "cannot write '" + request->output + "': " + std::strerror(errno);
      return 0;
    }
    response->written += static_cast<int64_t>(n);
    return n;
  }

  void draw(bool last) {
    if (request->progress.empty() || !terminal) return;
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!last && seconds - last_drawn < 0.2) return;
    last_drawn = seconds;
    int64_t before = response->appended ? request->resume_from : 0;
    std::string line = progress_line(request->progress, before + response->written, request->total, seconds);
    std::fprintf(stderr, "\r%s\033[K%s", line.c_str(), last ? "\n" : "");
    std::fflush(stderr);
    drawn = true;
  }
};

size_t on_body(char* data, size_t size, size_t count, void* user) {
  return static_cast<Transfer*>(user)->body(data, size * count);
}

size_t on_header(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  std::string line(data, size * count);
  if (line.rfind("HTTP/", 0) == 0) t->response->headers.clear();  // a new answer (after a 100 Continue)
  auto colon = line.find(':');
  if (colon != std::string::npos) {
    std::string value = line.substr(colon + 1);
    size_t a = value.find_first_not_of(" \t"), b = value.find_last_not_of(" \t\r\n");
    value = a == std::string::npos ? "" : value.substr(a, b - a + 1);
    t->response->headers.emplace_back(lower(line.substr(0, colon)), value);
  }
  return size * count;
}

int on_progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* t = static_cast<Transfer*>(user);
  if (t->request->cancelled && t->request->cancelled()) {
    t->response->cancelled = true;
    return 1;
  }
  if (t->request->min_rate > 0) {  // the overall progress rule: a trickle is cut too
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t->start).count();
    double bytes = static_cast<double>(t->response->written + static_cast<int64_t>(t->response->body.size()));
    if (seconds > t->request->stall_timeout && bytes / seconds < t->request->min_rate) {
      t->response->too_slow = true;
      return 1;
    }
  }
  t->draw(false);
  return 0;
}

}  // namespace

std::string progress_line(const std::string& label, int64_t done, int64_t total, double seconds) {
  std::string line = label + "  " + size_text(static_cast<double>(done));
  if (total > 0) line += " / " + size_text(static_cast<double>(total));
  double rate = seconds > 0 ? static_cast<double>(done) / seconds : 0;
  if (seconds > 0.5) line += "  " + size_text(rate) + "/s";
  if (total > 0 && rate > 0 && done < total) {
    char buf[32];
    double eta = static_cast<double>(total - done) / rate;
    if (eta < 60) std::snprintf(buf, sizeof buf, "  ETA %.0fs", eta);
    else if (eta < 3600) std::snprintf(buf, sizeof buf, "  ETA %dm%02ds", static_cast<int>(eta / 60), static_cast<int>(eta) % 60);
    else std::snprintf(buf, sizeof buf, "  ETA %dh%02dm", static_cast<int>(eta / 3600), static_cast<int>(eta / 60) % 60);
    line += buf;
  }
  return line;
}

HttpResponse http_request(const HttpRequest& request) {
  global_init();
  HttpResponse response;
  std::unique_ptr<CURL, decltype(&curl_easy_cleanup)> curl(curl_easy_init(), &curl_easy_cleanup);
  if (!curl) throw std::runtime_error("libcurl could not start a request");
  Transfer t(&request, &response, curl.get());
  struct curl_slist* list = nullptr;
  for (const auto& h : request.headers) list = curl_slist_append(list, h.c_str());
  std::string range;
  if (request.resume_from >= 0) {
    range = std::to_string(request.resume_from) + "-";
    curl_easy_setopt(curl.get(), CURLOPT_RANGE, range.c_str());
  }
  CURL* c = curl.get();
  curl_easy_setopt(c, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, list);
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  if (request.method == "HEAD") curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  else if (request.method != "GET") throw std::runtime_error("HTTP method must be GET or HEAD, got '" + request.method + "'");
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(request.connect_timeout * 1000));
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, std::max(1L, static_cast<long>(request.stall_timeout)));
  if (request.max_seconds > 0) curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(request.max_seconds * 1000));
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
  curl_easy_setopt(c, CURLOPT_XFERINFODATA, &t);
  curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
  char message[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, message);
  CURLcode code = curl_easy_perform(c);
  curl_slist_free_all(list);
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &response.status);
  if (t.file && std::fflush(t.file) != 0 && t.write_error.empty())
    t.write_error = "cannot write '" + request.output + "': " + std::strerror(errno);
  if (t.drawn) t.draw(true);
  if (!t.write_error.empty()) throw std::runtime_error(t.write_error);
  if (code != CURLE_OK) {
    response.error = message[0] ? message : curl_easy_strerror(code);
    if (response.too_large)
      response.error = "the server sent more than the " + std::to_string(request.max_bytes) + " bytes expected";
    else if (response.too_slow)
      response.error = "the transfer averaged under " + std::to_string(static_cast<long>(request.min_rate)) +
                       " bytes/s after " + std::to_string(static_cast<long>(request.stall_timeout)) + " s";
    else if (code == CURLE_OPERATION_TIMEDOUT && request.max_seconds > 0 &&
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t.start).count() >= request.max_seconds)
      response.too_slow = true;
    response.cut = code == CURLE_PARTIAL_FILE || code == CURLE_RECV_ERROR || code == CURLE_OPERATION_TIMEDOUT;
  }
  return response;
}

}  // namespace anatomy::net
