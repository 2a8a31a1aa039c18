// Built-in blocks in C++, without Lua: options checked once with the field
// named, PyTorch's parameter names and shapes, forward against ATen's own ops.
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
