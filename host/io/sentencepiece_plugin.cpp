// A small shared library around SentencePiece with a C interface, loaded at
// run time with dlopen (host/io/corpus.cpp). Debian's libsentencepiece
// carries its own copy of protobuf, whose symbols clash with the protobuf
// LibTorch loads: linked into the executable it crashes at start-up. Loaded
// with RTLD_LOCAL | RTLD_DEEPBIND, each keeps its own.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {
void set_error(char* err, size_t len, const std::string& msg) {
  if (err && len) {
    std::strncpy(err, msg.c_str(), len - 1);
    err[len - 1] = '\0';
  }
}
}  // namespace

extern "C" {

// Trains a model from a flag string ("--input=... --model_prefix=..."); 0 on success.
int anatomy_spm_train(const char* flags, char* err, size_t errlen) {
  // The trainer logs its command line before it reads --minloglevel: silence stderr meanwhile.
  std::fflush(stderr);
  int saved = dup(2);
  int null = open("/dev/null", O_WRONLY);
  if (null >= 0) dup2(null, 2);
  auto status = sentencepiece::SentencePieceTrainer::Train(flags);
  std::fflush(stderr);
  if (saved >= 0) {
    dup2(saved, 2);
    close(saved);
  }
  if (null >= 0) close(null);
  if (!status.ok()) {
    set_error(err, errlen, status.ToString());
    return 1;
  }
  return 0;
}

// Loads a .model file; null on failure.
void* anatomy_spm_load(const char* path, char* err, size_t errlen) {
  auto* sp = new sentencepiece::SentencePieceProcessor();
  auto status = sp->Load(path);
  if (!status.ok()) {
    set_error(err, errlen, status.ToString());
    delete sp;
    return nullptr;
  }
  return sp;
}

void anatomy_spm_free(void* sp) { delete static_cast<sentencepiece::SentencePieceProcessor*>(sp); }

int anatomy_spm_vocab_size(void* sp) { return static_cast<sentencepiece::SentencePieceProcessor*>(sp)->GetPieceSize(); }

// Encodes text into a malloc'ed array of piece ids (0-based); 0 on success.
int anatomy_spm_encode(void* sp, const char* text, size_t n, int** ids, size_t* count, char* err, size_t errlen) {
  std::vector<int> pieces;
  auto status = static_cast<sentencepiece::SentencePieceProcessor*>(sp)->Encode(absl::string_view(text, n), &pieces);
  if (!status.ok()) {
    set_error(err, errlen, status.ToString());
    return 1;
  }
  *count = pieces.size();
  *ids = static_cast<int*>(std::malloc(std::max<size_t>(1, pieces.size()) * sizeof(int)));
  std::memcpy(*ids, pieces.data(), pieces.size() * sizeof(int));
  return 0;
}

// Decodes piece ids (0-based) into a malloc'ed string; 0 on success.
int anatomy_spm_decode(void* sp, const int* ids, size_t count, char** text, size_t* n, char* err, size_t errlen) {
  std::string out;
  auto status = static_cast<sentencepiece::SentencePieceProcessor*>(sp)->Decode(std::vector<int>(ids, ids + count), &out);
  if (!status.ok()) {
    set_error(err, errlen, status.ToString());
    return 1;
  }
  *n = out.size();
  *text = static_cast<char*>(std::malloc(out.size() + 1));
  std::memcpy(*text, out.c_str(), out.size() + 1);
  return 0;
}

}  // extern "C"
