// jambo compare: samples generated through SequenceRunner (decode steps) re-scored in one shot, the
// input formats of other engines, malformed lines, the JSON summary and the HTML report.
#include "backend/cpu/cpu_backend.h"
#include "forensics/sequence_runner.h"
#include "forensics/compare.h"
#include "forensics/report.h"
#include "support/engine_test_util.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <sstream>

namespace jambo::forensics {
namespace {

using nlohmann::json;

const std::string kDemoModel = std::string(JAMBO_SOURCE_DIR) + "/models/jambo-demo";

// Greedy samples of the demo model in `jambo batch` / `jambo generate --json` format, one per prompt.
class CompareTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new model::Model(model::load_model(kDemoModel));
    tokenizer_ = new tokenizer::Tokenizer(tokenizer::Tokenizer::load(kDemoModel));
    std::vector<engine::RequestSpec> specs;
    const std::vector<std::string> prompts = {"Once upon a time", "The cat", "A", "In the morning the sun"};
    for (size_t i = 0; i < prompts.size(); ++i) {
      engine::RequestSpec& spec = specs.emplace_back();
      spec.id = fmt::format("req-{}", i);
      spec.prompt_ids = tokenizer_->encode(prompts[i]);
      spec.stop.max_tokens = 12;
      spec.stop.ignore_eos = true;
      spec.sampling.seed = 0;
    }
    // Chunked prefills (3 tokens a step) beside each other, then decode steps.
    engine::EngineOptions options = testing::exact_engine_options(*model_, 4, 8, 16, 64);
    options.max_num_batched_tokens = 3;
    engine::Engine engine(*model_, nullptr, options);
    lines_ = new std::vector<json>();
    for (const auto& [key, sample] : testing::run_to_end(engine, specs))
      lines_->push_back({{"id", sample.id},
                         {"sample", 0},
                         {"prompt_ids", sample.prompt_ids},
                         {"ids", sample.ids},
                         {"text", tokenizer_->decode(sample.ids)},
                         {"logprobs", sample.logprobs},
                         {"top_logprobs", json::array()},
                         {"finish_reason", sample.finish_reason}});
  }

  static void TearDownTestSuite() {
    delete lines_;
    delete tokenizer_;
    delete model_;
  }

  static std::string jsonl(const std::vector<json>& lines) {
    std::string text;
    for (const json& line : lines) text += line.dump() + "\n";
    return text;
  }

  static CompareSummary compare_text(const std::string& text, double threshold = kDefaultCompareThreshold) {
    std::istringstream input(text);
    return compare_samples(*model_, read_sample_file(input, model_->config.vocab_size), threshold);
  }

  static model::Model* model_;
  static tokenizer::Tokenizer* tokenizer_;
  static std::vector<json>* lines_;
};

model::Model* CompareTest::model_ = nullptr;
tokenizer::Tokenizer* CompareTest::tokenizer_ = nullptr;
std::vector<json>* CompareTest::lines_ = nullptr;

TEST_F(CompareTest, GreedySamplesMatchTheOneShotReferenceBitwise) {
  const CompareSummary summary = compare_text(jsonl(*lines_), /*threshold=*/0.0);
  ASSERT_EQ(summary.samples.size(), lines_->size());
  EXPECT_EQ(summary.num_flagged(), 0);
  EXPECT_EQ(compare_exit_code(summary), 0);
  for (const SampleComparison& comparison : summary.samples) {
    EXPECT_EQ(comparison.abs_diffs.size(), 12u);
    // Decode steps and one-shot prefill agree bitwise on the CPU backend (DESIGN.md laws 4 and 5).
    EXPECT_EQ(comparison.max_abs_diff, 0.0) << comparison.sample.id;
    EXPECT_FALSE(comparison.first_divergent_position);
  }
}

TEST_F(CompareTest, OnePerturbedLogprobFlagsThatSampleAtThatPosition) {
  std::vector<json> lines = *lines_;
  lines[1]["logprobs"][5] = lines[1]["logprobs"][5].get<double>() + 1e-2;
  const CompareSummary summary = compare_text(jsonl(lines));
  EXPECT_EQ(summary.num_flagged(), 1);
  EXPECT_EQ(compare_exit_code(summary), kFlaggedExitCode);
  const SampleComparison& flagged = summary.samples[1];
  EXPECT_TRUE(flagged.flagged);
  EXPECT_EQ(flagged.first_divergent_position, 5);
  EXPECT_NEAR(flagged.max_abs_diff, 1e-2, 1e-12);
  EXPECT_NEAR(flagged.mean_abs_diff, 1e-2 / 12, 1e-12);
  EXPECT_EQ(summary.worst(), &flagged);

  const json out = summary_json(summary);
  EXPECT_EQ(out["num_samples"], 4);
  EXPECT_EQ(out["num_flagged"], 1);
  EXPECT_EQ(out["num_tokens"], 48);
  EXPECT_EQ(out["worst"]["id"], "req-1");
  EXPECT_EQ(out["samples"][1]["first_divergent_position"], 5);
  EXPECT_EQ(out["samples"][1]["flagged"], true);
  EXPECT_EQ(out["samples"][1]["num_tokens"], 12);
  EXPECT_TRUE(out["samples"][0]["first_divergent_position"].is_null());
  EXPECT_EQ(out["samples"][0]["max_abs_diff"], 0.0);
  EXPECT_EQ(out["samples"][2]["line"], 3);
}

// The verdict in one line: the largest |Δ| is named as the largest, with where it is, whether flagged or not, and
// no number runs into the next clause; nothing is named when every |Δ| is 0.
TEST(DescribeComparison, NamesTheLargestDifferenceAndWhereItIs) {
  Sample differs;
  differs.id = "x";
  differs.sample = 1;
  differs.line_number = 7;
  differs.ids = {1, 2, 3};
  differs.logprobs = {-1.0, -2.0, -3.0};
  Sample equal = differs;
  equal.id = 4;
  equal.line_number = 8;
  const std::vector<double> reference = {-1.0, 0.0, -2.5};  // |Δ| 2 at position 1
  const auto summary_at = [&](double threshold) {
    CompareSummary summary;
    summary.threshold = threshold;
    summary.samples = {compare_logprobs(equal, equal.logprobs, threshold),
                       compare_logprobs(differs, reference, threshold)};
    return summary;
  };
  EXPECT_EQ(describe_comparison(summary_at(1e-3)),
            "1 of 2 samples flagged (|Δ logprob| above 0.001); 6 generated tokens compared; largest |Δ logprob| 2 "
            "(id \"x\", sample 1, line 7, position 1)");
  CompareSummary unflagged = summary_at(5.0);
  unflagged.malformed_lines = {{9, "malformed JSON"}};
  EXPECT_EQ(describe_comparison(unflagged),
            "0 of 2 samples flagged (|Δ logprob| above 5); 6 generated tokens compared; largest |Δ logprob| 2 "
            "(id \"x\", sample 1, line 7, position 1); 1 malformed line skipped");
  CompareSummary clean;
  clean.samples = {compare_logprobs(equal, equal.logprobs, 1e-3)};
  EXPECT_EQ(describe_comparison(clean),
            "0 of 1 samples flagged (|Δ logprob| above 0.001); 3 generated tokens compared; every |Δ logprob| is 0");
}

TEST_F(CompareTest, ThresholdIsExclusiveAndOnlyLaterPositionsCountAfterTheFirst) {
  Sample sample;
  sample.ids = {1, 2, 3, 4};
  sample.logprobs = {-1.0, -2.0, -3.0, -4.0};
  const std::vector<double> reference = {-1.0, -2.25, -3.5, -4.0};
  const SampleComparison at_threshold = compare_logprobs(sample, reference, 0.5);
  EXPECT_FALSE(at_threshold.flagged);
  EXPECT_EQ(at_threshold.max_abs_diff, 0.5);
  EXPECT_EQ(at_threshold.mean_abs_diff, 0.75 / 4);
  const SampleComparison below = compare_logprobs(sample, reference, 0.2);
  EXPECT_TRUE(below.flagged);
  EXPECT_EQ(below.first_divergent_position, 1);
}

TEST_F(CompareTest, NotANumberInTheReferenceFlagsTheSample) {
  Sample sample;
  sample.ids = {1, 2};
  sample.logprobs = {-1.0, -2.0};
  const std::vector<double> reference = {-1.0, std::nan("")};
  const SampleComparison comparison = compare_logprobs(sample, reference, 1.0);
  EXPECT_TRUE(comparison.flagged);
  EXPECT_EQ(comparison.first_divergent_position, 1);
  EXPECT_TRUE(std::isinf(comparison.max_abs_diff));
}

TEST_F(CompareTest, VllmStyleLinesParseAndMatch) {
  const json& jambo = (*lines_)[0];
  json as_dicts = {{"request_id", "v-0"}, {"prompt_token_ids", jambo["prompt_ids"]}, {"token_ids", jambo["ids"]}};
  json as_pairs = {
      {"request_id", "v-1"}, {"prompt_token_ids", jambo["prompt_ids"]}, {"output_token_ids", jambo["ids"]}};
  as_dicts["logprobs"] = json::array();
  as_pairs["logprobs"] = json::array();
  for (size_t i = 0; i < jambo["ids"].size(); ++i) {
    const std::string key = std::to_string(jambo["ids"][i].get<int>());
    const double logprob = jambo["logprobs"][i];
    // A decoy entry first: the generated id's value must be the one read.
    as_dicts["logprobs"].push_back(
        {{"0", {{"logprob", -99.0}, {"rank", 2}}}, {key, {{"logprob", logprob}, {"rank", 1}}}});
    as_pairs["logprobs"].push_back(json::array({json::array({0, -99.0}), json::array({jambo["ids"][i], logprob})}));
  }
  const json request_output = {{"request_id", "v-2"},
                               {"prompt_token_ids", jambo["prompt_ids"]},
                               {"outputs",
                                {{{"index", 0}, {"token_ids", jambo["ids"]}, {"logprobs", jambo["logprobs"]}},
                                 {{"token_ids", jambo["ids"]}, {"logprobs", jambo["logprobs"]}}}}};

  const std::vector<Sample> dicts = parse_sample_line(as_dicts, 1, model_->config.vocab_size);
  ASSERT_EQ(dicts.size(), 1u);
  EXPECT_EQ(dicts[0].id, "v-0");
  EXPECT_EQ(json(dicts[0].ids), jambo["ids"]);
  EXPECT_EQ(json(dicts[0].logprobs), jambo["logprobs"]);
  const std::vector<Sample> pairs = parse_sample_line(as_pairs, 2, model_->config.vocab_size);
  EXPECT_EQ(json(pairs.at(0).logprobs), jambo["logprobs"]);
  const std::vector<Sample> outputs = parse_sample_line(request_output, 3, model_->config.vocab_size);
  ASSERT_EQ(outputs.size(), 2u);
  EXPECT_EQ(outputs[1].sample, 1);
  EXPECT_EQ(outputs[1].id, "v-2");
  EXPECT_EQ(json(outputs[1].prompt_ids), jambo["prompt_ids"]);

  const CompareSummary summary = compare_text(jsonl({as_dicts, as_pairs, request_output}), 0.0);
  ASSERT_EQ(summary.samples.size(), 4u);
  EXPECT_EQ(summary.num_flagged(), 0);
  EXPECT_TRUE(summary.malformed_lines.empty());
}

TEST_F(CompareTest, TransformersStyleLinesParseAndMatch) {
  const json& jambo = (*lines_)[2];
  json sequences = jambo["prompt_ids"];
  for (const json& id : jambo["ids"]) sequences.push_back(id);
  // transformers' scores: one [batch = 1, vocab] tensor of logits per generated token; here the
  // reference's own log-probabilities, which log-softmax leaves unchanged up to float rounding.
  const int64_t vocab_size = model_->config.vocab_size;
  backend::CacheConfig cache;
  cache.num_kv_blocks = 2;
  const std::unique_ptr<backend::Backend> backend = backend::cpu::make_cpu_backend(*model_, cache);
  SequenceRunner runner(*backend, cache);
  const ScoredSequence scored = runner.score(sequences.get<std::vector<int32_t>>(), vocab_size, "the sequence");
  json scores = json::array();
  for (size_t position = jambo["prompt_ids"].size(); position < sequences.size(); ++position) {
    std::vector<double> row(vocab_size);
    for (const backend::TokenLogprob& entry : scored.top_logprobs[position]) row[entry.token] = entry.logprob;
    scores.push_back(json::array({row}));
  }
  const json hf_rows = {
      {"input_ids", json::array({jambo["prompt_ids"]})}, {"sequences", json::array({sequences})}, {"scores", scores}};
  const json hf_numbers = {
      {"input_ids", jambo["prompt_ids"]}, {"generated_ids", jambo["ids"]}, {"logprobs", jambo["logprobs"]}};

  const std::vector<Sample> rows = parse_sample_line(hf_rows, 7, vocab_size);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].id, 7);
  EXPECT_EQ(json(rows[0].prompt_ids), jambo["prompt_ids"]);
  EXPECT_EQ(json(rows[0].ids), jambo["ids"]);
  for (size_t i = 0; i < rows[0].logprobs.size(); ++i) EXPECT_NEAR(rows[0].logprobs[i], jambo["logprobs"][i], 1e-5);

  const CompareSummary summary = compare_text(jsonl({hf_rows, hf_numbers}));
  ASSERT_EQ(summary.samples.size(), 2u);
  EXPECT_EQ(summary.num_flagged(), 0);
  EXPECT_LT(summary.samples[0].max_abs_diff, 1e-5);
  EXPECT_EQ(summary.samples[1].max_abs_diff, 0.0);
}

TEST_F(CompareTest, MalformedLinesAreSkippedCountedAndNamed) {
  const json good = (*lines_)[0];
  json short_logprobs = good;
  short_logprobs["logprobs"].erase(0);
  json outside_vocabulary = good;
  outside_vocabulary["ids"][0] = model_->config.vocab_size;
  json empty_prompt = good;
  empty_prompt["prompt_ids"] = json::array();
  json missing_token = good;
  missing_token["logprobs"][0] = {{"0", -1.0}};
  json bad_sequences = {{"input_ids", {5, 6}}, {"sequences", {6, 5, 7}}, {"logprobs", {-1.0}}};
  const std::string text = good.dump() + "\n" + "{not json\n" + "\n" + "[1, 2]\n" + short_logprobs.dump() + "\n" +
                           outside_vocabulary.dump() + "\n" + empty_prompt.dump() + "\n" + missing_token.dump() + "\n" +
                           json{{"id", 1}}.dump() + "\n" + bad_sequences.dump() + "\n" + good.dump() + "\n";
  std::istringstream input(text);
  const SampleFile file = read_sample_file(input, model_->config.vocab_size);
  ASSERT_EQ(file.samples.size(), 2u);
  EXPECT_EQ(file.samples[1].line_number, 11);
  const std::vector<std::pair<int64_t, std::string>> expected = {{2, "malformed JSON"},
                                                                 {4, "expected a JSON object"},
                                                                 {5, "has 11 entries for 12 generated ids"},
                                                                 {6, "field 'ids'"},
                                                                 {7, "is empty"},
                                                                 {8, "field 'logprobs', entry 0: the generated id"},
                                                                 {9, "no prompt ids"},
                                                                 {10, "does not start with"}};
  ASSERT_EQ(file.malformed_lines.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(file.malformed_lines[i].line_number, expected[i].first);
    EXPECT_NE(file.malformed_lines[i].error.find(expected[i].second), std::string::npos)
        << file.malformed_lines[i].error;
  }

  const CompareSummary summary = compare_text(text);
  EXPECT_EQ(summary.samples.size(), 2u);
  const json out = summary_json(summary);
  EXPECT_EQ(out["num_malformed_lines"], 8);
  EXPECT_EQ(out["malformed_lines"][0]["line"], 2);
  EXPECT_EQ(compare_exit_code(summary), 0);
}

TEST_F(CompareTest, DeeplyNestedValuesAreRejectedWithoutRecursion) {
  const std::string nested = std::string(100000, '[') + std::string(100000, ']');
  const json line = json::parse(R"({"prompt_ids": [1], "ids": [2], "logprobs": )" + nested + "}");
  EXPECT_THROW(parse_sample_line(line, 1, model_->config.vocab_size), Error);
  const json id_line = json::parse(R"({"id": )" + nested + R"(, "prompt_ids": [1], "ids": [], "logprobs": []})");
  EXPECT_THROW(parse_sample_line(id_line, 1, model_->config.vocab_size), Error);
}

TEST_F(CompareTest, HtmlReportHasThePlotsTheFlaggedSampleAndEscapedText) {
  std::vector<json> lines = *lines_;
  // A generated text that is markup: it must be shown, never run.
  const std::vector<int32_t> markup = tokenizer_->encode("<script>alert(1)</script>", /*add_special_tokens=*/false);
  ASSERT_EQ(tokenizer_->decode(markup), "<script>alert(1)</script>");
  lines[3]["id"] = "<b>request</b>";
  lines[3]["ids"] = markup;
  lines[3]["logprobs"] = std::vector<double>(markup.size(), -1.0);  // wrong on purpose: flagged at position 0
  const CompareSummary summary = compare_text(jsonl(lines) + "{broken\n");
  ASSERT_EQ(summary.num_flagged(), 1);
  const std::string html = render_html_report(summary, tokenizer_);

  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_NE(html.find("threshold 0.001"), std::string::npos);
  EXPECT_NE(html.find("fill=\"#d62728\"><title>id &lt;b&gt;request&lt;/b&gt; sample 0"), std::string::npos);
  EXPECT_NE(html.find("1 of 4 samples flagged"), std::string::npos);
  EXPECT_NE(html.find("line 5: malformed JSON"), std::string::npos);
  EXPECT_NE(html.find("<mark title=\"position 0:"), std::string::npos);
  EXPECT_NE(html.find("&lt;</mark><span class=\"after\">script&gt;alert(1)&lt;/script&gt;"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<b>"), std::string::npos);
  // Self-contained: nothing to fetch (the SVG namespace is a name, not a download).
  EXPECT_EQ(html.find("src="), std::string::npos);
  EXPECT_EQ(html.find("href="), std::string::npos);
  EXPECT_EQ(html.find("url("), std::string::npos);

  const std::string without_tokenizer = render_html_report(summary, nullptr);
  EXPECT_NE(without_tokenizer.find(fmt::format("{} </mark>", markup[0])), std::string::npos);
}

TEST_F(CompareTest, HtmlReportOfACleanRunSaysSo) {
  const std::string html = render_html_report(compare_text(jsonl(*lines_)), tokenizer_);
  EXPECT_NE(html.find("0 of 4 samples flagged"), std::string::npos);
  EXPECT_NE(html.find("equal the reference's exactly"), std::string::npos);
  EXPECT_EQ(html.find("<mark"), std::string::npos);
}

TEST(HtmlEscape, EscapesMarkupAndQuotes) {
  EXPECT_EQ(html_escape("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&#39;");
  EXPECT_EQ(html_escape("plain ünïcode"), "plain ünïcode");
}

}  // namespace
}  // namespace jambo::forensics
