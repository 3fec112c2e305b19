// max_model_len against the model's positions (config.json's max_position_embeddings): never beyond them, and by
// default the smaller of them and kDefaultMaxModelLen.
#include "support/engine_test_util.h"

#include <gmock/gmock.h>

namespace jambo::testing {
namespace {

using ::testing::HasSubstr;

// An engine whose budget holds one request of `tokens` tokens (KV blocks of 4 tokens); max_model_len unset.
engine::EngineOptions options_for(const model::Model& model, int64_t tokens) {
  engine::EngineOptions options =
      exact_engine_options(model, /*max_num_seqs=*/1, /*num_kv_blocks=*/(tokens + 3) / 4, /*kv_block_size=*/4, tokens);
  options.max_model_len.reset();
  return options;
}

TEST(MaxModelLen, DefaultsToTheModelsPositionsWhenFewer) {
  OneThread one_thread;
  model::Model model = load_fixture_model();
  model.config.max_position_embeddings = 48;
  engine::Engine engine(model, nullptr, options_for(model, 48));
  EXPECT_EQ(engine.max_model_len(), 48);
  engine::RequestSpec spec;
  spec.id = "long";
  spec.prompt_ids.assign(40, 1);
  spec.stop.max_tokens = 9;
  EXPECT_THAT([&] { engine.add_request(spec); },
              ::testing::ThrowsMessage<Error>(HasSubstr("max_model_len is 48")));
}

TEST(MaxModelLen, DefaultsToTheEngineDefaultWhenTheModelHasMorePositions) {
  OneThread one_thread;
  model::Model model = load_fixture_model();
  ASSERT_GT(model.config.max_position_embeddings, engine::kDefaultMaxModelLen);
  engine::Engine engine(model, nullptr, options_for(model, engine::kDefaultMaxModelLen));
  EXPECT_EQ(engine.max_model_len(), engine::kDefaultMaxModelLen);
}

TEST(MaxModelLen, BeyondTheModelsPositionsIsRefused) {
  OneThread one_thread;
  model::Model model = load_fixture_model();
  model.config.max_position_embeddings = 48;
  engine::EngineOptions options = options_for(model, 64);
  options.max_model_len = 49;
  EXPECT_THAT([&] { engine::Engine engine(model, nullptr, options); },
              ::testing::ThrowsMessage<Error>(
                  HasSubstr("max_model_len 49 exceeds the model's max_position_embeddings (48)")));
  options.max_model_len = 48;
  EXPECT_EQ(engine::Engine(model, nullptr, options).max_model_len(), 48);
}

}  // namespace
}  // namespace jambo::testing
