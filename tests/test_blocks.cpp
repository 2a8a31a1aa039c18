// Built-in blocks in C++, without Lua: options checked once with the field
// named, PyTorch's parameter names and shapes, forward against ATen's own ops,
// the attentions' paths (fused, hooked, cached, padded) against each other.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include "host/nn/blocks.h"

using namespace anatomy::nn;

namespace {
double maxdiff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

template <typename F>
std::string option_error_field(F make) {
  try {
    make();
  } catch (const OptionError& e) {
    return e.field + ": " + e.what();
  }
  return "no error";
}
}  // namespace

TEST_CASE("block options are checked once, naming the field") {
  CHECK(option_error_field([] { Linear(LinearOptions(0, 3)); }) == "in_features: in_features must be positive, got 0");
  CHECK(option_error_field([] { Attention(AttentionOptions(10, 3)); }) == "heads: dim 10 is not divisible by 3 heads");
  CHECK(option_error_field([] { LayerNorm(NormOptions(4, 0)); }) == "eps: eps must be positive, got 0");
  CHECK(option_error_field([] { MLP(MLPOptions(4, 8).activation("tanh")); }) ==
        "activation: unknown activation 'tanh', expected gelu, gelu_tanh or relu");
  CHECK(option_error_field([] { Dropout(1.0); }) == "p: dropout probability must be in [0, 1), got 1");
  CHECK(option_error_field([] { Embedding(EmbeddingOptions(5, 4).positions(-1)); }) == "positions: positions must be positive, got -1");
}

TEST_CASE("parameters have PyTorch's names and shapes") {
  Linear lin(LinearOptions(3, 5).bias(false));
  CHECK(lin.weight.sizes() == at::IntArrayRef({5, 3}));
  CHECK_FALSE(lin.bias.defined());
  Attention attn(AttentionOptions(8, 2).bias(true));
  std::vector<std::string> names;
  for (const auto& p : attn.named_parameters()) names.push_back(p.key());
  CHECK(names == std::vector<std::string>{"qkv.weight", "qkv.bias", "proj.weight", "proj.bias"});
  Embedding emb(EmbeddingOptions(7, 4).positions(6));
  CHECK(emb.pos_weight.sizes() == at::IntArrayRef({6, 4}));
}

TEST_CASE("forward passes match ATen's operations on the same weights") {
  at::manual_seed(1);
  at::Tensor x = at::randn({2, 5, 8});
  SECTION("Linear") {
    Linear lin(LinearOptions(8, 3));
    CHECK(maxdiff(lin.forward(x), at::matmul(x, lin.weight.t()) + lin.bias) < 1e-6);
  }
  SECTION("RMSNorm") {
    RMSNorm norm(NormOptions(8, 1e-6));
    at::Tensor want = x / at::sqrt(x.pow(2).mean(-1, true) + 1e-6);
    CHECK(maxdiff(norm.forward(x), want) < 1e-6);
  }
  SECTION("RMSNorm in bfloat16: normalised in float32, as transformers' Llama (offset 0) and Gemma (offset 1)") {
    at::Tensor xb = (x * 30).to(at::kBFloat16), xf = xb.to(at::kFloat);
    at::Tensor n = xf * at::rsqrt(xf.pow(2).mean(-1, true) + 1e-6);
    for (double offset : {0.0, 1.0}) {
      RMSNorm norm(NormOptions(8, 1e-6).offset(offset));
      {
        at::NoGradGuard no_grad;
        norm.weight.copy_(at::randn({8}) * 0.5);
      }
      at::Tensor wb = norm.weight.detach().to(at::kBFloat16);
      norm.to(at::kBFloat16);
      at::Tensor want = offset == 0 ? n.to(at::kBFloat16) * wb : (n * (wb.to(at::kFloat) + offset)).to(at::kBFloat16);
      at::Tensor got = norm.forward(xb);
      INFO("offset " << offset);
      CHECK(got.scalar_type() == at::kBFloat16);
      CHECK(maxdiff(got.to(at::kFloat), want.to(at::kFloat)) == 0);
      std::vector<std::string> seen;
      norm.hook = [&](const char* name, const at::Tensor& t) { return seen.push_back(name + std::string(":") + (t.scalar_type() == at::kBFloat16 ? "bf16" : "other")), t; };
      // hooked: x / scale rather than x * rsqrt, so at most one bfloat16 rounding step apart (outputs below 4)
      CHECK(maxdiff(norm.forward(xb).to(at::kFloat), got.to(at::kFloat)) <= 0.016);
      CHECK(seen == std::vector<std::string>{"scale:bf16", "normalized:bf16"});
    }
  }
  SECTION("MLP applies its activation between fc and proj") {
    MLP mlp(MLPOptions(8, 16).activation("relu"));
    at::Tensor want = mlp.proj->forward(at::relu(mlp.fc->forward(x)));
    CHECK(maxdiff(mlp.forward(x), want) == 0);
    CHECK(maxdiff(Activation::apply("gelu_tanh", x), at::gelu(x, "tanh")) == 0);
  }
  SECTION("causal attention: the first position attends only to itself") {
    Attention attn(AttentionOptions(8, 2));
    attn.keep_pattern = true;
    attn.forward(x);
    REQUIRE(attn.pattern.sizes() == at::IntArrayRef({2, 2, 5, 5}));
    CHECK(attn.pattern.select(2, 0).select(2, 0).min().item<double>() == 1.0);
    CHECK(maxdiff(attn.pattern.sum(-1), at::ones({2, 2, 5})) < 1e-6);
  }
  SECTION("Embedding: 1-based ids, out of range named") {
    Embedding emb(EmbeddingOptions(4, 3));
    at::Tensor ids = at::tensor({1, 4}, at::kLong);
    CHECK(maxdiff(emb.forward(ids), emb.weight.index_select(0, ids - 1)) == 0);
    CHECK_THROWS_WITH(emb.forward(at::tensor({0}, at::kLong)), "token id 0 is out of range 1..4 (ids are 1-based)");
  }
}

// The attentions' paths (one fused kernel, the explicit hooked one, the key/value
// cache, the padding mask) must give the same outputs; tolerance 1e-5 in float32.
TEST_CASE("attention's fused, hooked, cached and padded paths agree") {
  at::manual_seed(2);
  at::Tensor x = at::randn({2, 6, 16});
  std::shared_ptr<Native> attn;
  std::vector<std::string> points;
  SECTION("Attention") {
    attn = std::make_shared<Attention>(AttentionOptions(16, 4));
    points = {"q", "k", "v", "scores", "pattern", "z", "result"};
  }
  SECTION("RoPEAttention: grouped keys, partial rotary, sliding window") {
    attn = std::make_shared<RoPEAttention>(RoPEAttentionOptions(16, 4).kv_heads(2).rotary_dim(2).sliding_window(3));
    points = {"q", "k", "v", "rot_q", "rot_k", "scores", "pattern", "z", "result"};
  }
  SECTION("RoPEAttention: Gemma's scale and soft-capping, QK-norm per head, interleaved pairs") {
    attn = std::make_shared<RoPEAttention>(
        RoPEAttentionOptions(16, 4).kv_heads(2).scale(0.3).softcap(2.0).qk_norm("head").qk_norm_offset(1.0).interleaved(true));
    points = {"q", "q_normed", "k", "k_normed", "v", "rot_q", "rot_k", "scores", "pattern", "z", "result"};
  }
  SECTION("RoPEAttention: QK-norm over the projection, a scale through the fused kernel, longrope") {
    attn = std::make_shared<RoPEAttention>(RoPEAttentionOptions(16, 4).kv_heads(2).scale(0.2).qk_norm("proj").scaling("longrope")
                                               .short_factor({1.0, 1.3}).long_factor({2.0, 4.0}).original_max_positions(64)
                                               .attention_factor(1.1));
    points = {"q", "q_normed", "k", "k_normed", "v", "rot_q", "rot_k", "scores", "pattern", "z", "result"};
  }
  const at::Tensor plain = attn->forward(x);  // fused where LibTorch has the kernel
  auto agrees = [&](const at::Tensor& y, const char* what) {
    INFO(what << ": maxdiff " << maxdiff(y, plain));
    CHECK(maxdiff(y, plain) < 1e-5);
  };
  attn->keep_pattern = true;
  agrees(attn->forward(x), "kept pattern");
  CHECK(maxdiff(attn->pattern.sum(-1), at::ones({2, 4, 6})) < 1e-6);
  attn->keep_pattern = false;

  std::vector<std::string> seen;
  attn->hook = [&](const char* name, const at::Tensor& t) { return seen.push_back(name), t; };
  attn->wanted = {"result"};
  agrees(attn->forward(x), "identity hooks");
  CHECK(seen == points);
  attn->hook = nullptr;

  attn->set_cache(true);
  agrees(at::cat({attn->forward(x.narrow(1, 0, 4)), attn->forward(x.narrow(1, 4, 1)), attn->forward(x.narrow(1, 5, 1))}, 1),
         "cached, 4 then 1 and 1 positions");
  attn->set_cache(false);

  at::Tensor mask = at::ones({2, 6}, at::kBool);
  attn->set_mask(mask);
  agrees(attn->forward(x), "padding mask without padding");
  CHECK_THROWS_AS(attn->forward(x.narrow(1, 0, 5)), InputError);
  mask[0].narrow(0, 0, 2).fill_(false);  // example 1 left-padded by 2: its real tokens as if alone
  at::Tensor padded = attn->forward(x).select(0, 0).narrow(0, 2, 4);
  attn->set_mask(at::Tensor());
  at::Tensor alone = attn->forward(x.narrow(0, 0, 1).narrow(1, 2, 4)).select(0, 0);
  INFO("left padding: maxdiff " << maxdiff(padded, alone));
  CHECK(maxdiff(padded, alone) < 1e-5);
}

// GPT-2's attention takes its softmax in the scores' dtype, Llama's in float32
// then back to the input's (as transformers does each): bfloat16 patterns equal,
// bit for bit, those softmaxes of the scores the hook saw. (The CPU's bfloat16
// softmax accumulates in float32, so on the CPU the two formulas agree.)
TEST_CASE("attention's softmax dtype: the scores' for Attention, float32 for RoPEAttention") {
  at::manual_seed(3);
  at::Tensor x = at::randn({1, 5, 8}).to(at::kBFloat16);
  auto pattern_and_scores = [&](Native& attn) {
    attn.to(at::kBFloat16);
    at::Tensor scores;
    attn.hook = [&](const char* name, const at::Tensor& t) {
      if (std::string(name) == "scores") scores = t.clone();
      return t;
    };
    attn.keep_pattern = true;
    attn.forward(x);
    REQUIRE(attn.pattern.scalar_type() == at::kBFloat16);
    return std::make_pair(attn.pattern, scores);
  };
  Attention gpt2(AttentionOptions(8, 2));
  auto [p1, s1] = pattern_and_scores(gpt2);
  CHECK(at::equal(p1, at::softmax(s1, -1)));
  RoPEAttention llama(RoPEAttentionOptions(8, 2));
  auto [p2, s2] = pattern_and_scores(llama);
  CHECK(at::equal(p2, at::softmax(s2.to(at::kFloat), -1).to(at::kBFloat16)));
}
