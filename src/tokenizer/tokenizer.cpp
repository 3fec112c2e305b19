// Tokenizer: loads tokenizer.json (+ tokenizer_config.json) and runs HF's pipeline:
// added tokens -> normalizer -> pre-tokenizer -> BPE -> post-processor, and back through the
// decoder chain.
#include "tokenizer/tokenizer.h"

#include "core/error.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/unicode.h"

namespace jambo::tokenizer {

namespace {

// tokenizer_config.json names special tokens either as a string or as {"content": "..."}.
std::optional<std::string> special_token_name(const JsonField& config, std::string_view key) {
  auto field = config.find(key);
  if (!field) return std::nullopt;
  if (field->json().is_object()) return field->at("content").as_string();
  return field->as_string();
}

// An optional component of tokenizer.json: absent or null means "none".
template <typename Component>
Component optional_component(const JsonField& root, std::string_view key) {
  auto field = root.find(key);
  return field ? Component(*field) : Component();
}

// Ids must be dense: each below the number of tokens the file declares (model.vocab's entries and added_tokens'),
// so that the tables they index stay as small as the file.
int64_t token_id_limit(const JsonField& root) {
  const auto vocab = root.at("model").find("vocab");
  const auto added_tokens = root.find("added_tokens");
  const size_t num_tokens = (vocab && vocab->json().is_object() ? vocab->json().size() : 0) +
                            (added_tokens && added_tokens->json().is_array() ? added_tokens->size() : 0);
  return std::min<int64_t>(int64_t(num_tokens), int64_t(INT32_MAX) + 1);
}

BpeModel read_model(const JsonField& root) {
  const JsonField model = root.at("model");
  const std::string type = model.find("type") ? model.type() : "BPE";
  if (type != "BPE") {
    model.fail(fmt::format("model type '{}' is not supported (only BPE is)", type));
  }
  return BpeModel(model, token_id_limit(root));
}

}  // namespace

struct Tokenizer::Impl {
  Impl(const JsonField& root, const std::optional<JsonField>& config);

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const;
  const std::string* id_to_token(int32_t id) const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<int32_t> config_token_id(const std::optional<JsonField>& config,
                                         std::string_view key) const;

  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  BpeModel model;
  AddedVocabulary added;
  PostProcessor post_processor;
  Decoder decoder;
  std::optional<int32_t> bos_id;
  std::optional<int32_t> eos_id;
};

Tokenizer::Impl::Impl(const JsonField& root, const std::optional<JsonField>& config)
    : normalizer(optional_component<Normalizer>(root, "normalizer")),
      pre_tokenizer(optional_component<PreTokenizer>(root, "pre_tokenizer")),
      model(read_model(root)),
      decoder(optional_component<Decoder>(root, "decoder")) {
  if (auto added_tokens = root.find("added_tokens")) {
    added = AddedVocabulary(*added_tokens, token_id_limit(root), normalizer, model);
  }
  bos_id = config_token_id(config, "bos_token");
  eos_id = config_token_id(config, "eos_token");
  if (auto processor = root.find("post_processor")) {
    post_processor = PostProcessor(*processor);
  } else if (config) {
    post_processor = PostProcessor(config->bool_or("add_bos_token", false) ? bos_id : std::nullopt,
                                   config->bool_or("add_eos_token", false) ? eos_id : std::nullopt);
  }
  if (!bos_id) bos_id = post_processor.leading_special_id();
}

std::optional<int32_t> Tokenizer::Impl::config_token_id(const std::optional<JsonField>& config,
                                                        std::string_view key) const {
  if (!config) return std::nullopt;
  const auto name = special_token_name(*config, key);
  if (!name) return std::nullopt;
  const auto id = token_to_id(*name);
  JAMBO_REQUIRE(id, "{}: {} '{}' is not a token of tokenizer.json", config->file(), key, *name);
  return id;
}

std::vector<int32_t> Tokenizer::Impl::encode(std::string_view raw_text,
                                             bool add_special_tokens) const {
  const std::string text = unicode::to_valid_utf8(raw_text);
  std::vector<int32_t> ids;
  for (const Segment& raw : added.split_raw(text, true)) {
    if (raw.token_id) {
      ids.push_back(*raw.token_id);
      continue;
    }
    for (const Segment& segment :
         added.split_normalized(normalizer.normalize(raw.text), raw.at_text_start)) {
      if (segment.token_id) {
        ids.push_back(*segment.token_id);
        continue;
      }
      for (const TextPiece& word :
           pre_tokenizer.pre_tokenize({{segment.text, segment.at_text_start}})) {
        model.tokenize(word.text, ids);
      }
    }
  }
  return add_special_tokens ? post_processor.add_special_tokens(ids) : ids;
}

const std::string* Tokenizer::Impl::id_to_token(int32_t id) const {
  if (const AddedToken* token = added.find(id)) return &token->content;
  return model.id_to_token(id);
}

std::optional<int32_t> Tokenizer::Impl::token_to_id(std::string_view token) const {
  if (auto id = added.find(token)) return id;
  return model.token_to_id(token);
}

// Ids without a token are skipped, as HF does.
std::string Tokenizer::Impl::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    const std::string* token = id_to_token(id);
    if (!token) continue;
    const AddedToken* added_token = added.find(id);
    if (skip_special_tokens && added_token && added_token->special) continue;
    tokens.push_back(*token);
  }
  return decoder.decode(std::move(tokens));
}

Tokenizer Tokenizer::load(const std::filesystem::path& folder) {
  const std::filesystem::path tokenizer_path = folder / "tokenizer.json";
  std::error_code error;  // a path that cannot be looked at (too long, say) is not found, not a library exception
  JAMBO_REQUIRE(std::filesystem::exists(tokenizer_path, error), "{}: file not found", tokenizer_path.string());
  const nlohmann::json tokenizer_json = read_json_file(tokenizer_path);
  const JsonField root(tokenizer_json, tokenizer_path.string(), "");
  if (!tokenizer_json.is_object()) root.fail("expected a JSON object");

  const std::filesystem::path config_path = folder / "tokenizer_config.json";
  nlohmann::json config_json;
  std::optional<JsonField> config;
  if (std::filesystem::exists(config_path, error)) {
    config_json = read_json_file(config_path);
    config.emplace(config_json, config_path.string(), "");
    if (!config_json.is_object()) config->fail("expected a JSON object");
  }
  return Tokenizer(std::make_unique<Impl>(root, config));
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  return impl_->encode(text, add_special_tokens);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  return impl_->decode(ids, skip_special_tokens);
}

int64_t Tokenizer::vocab_size() const {
  return std::max(impl_->model.max_id(), impl_->added.max_id()) + 1;
}
std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos_id; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos_id; }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  return impl_->token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  const std::string* token = impl_->id_to_token(id);
  return token ? std::optional<std::string>(*token) : std::nullopt;
}

bool Tokenizer::is_special(int32_t id) const {
  const AddedToken* token = impl_->added.find(id);
  return token && token->special;
}

}  // namespace jambo::tokenizer
