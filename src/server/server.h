// The OpenAI-compatible HTTP server: routes, streaming, errors. One EngineLoop serves every
// connection; each HTTP request becomes one engine request per prompt.
#pragma once

#include "engine/engine.h"
#include "server/http_request_parser.h"
#include "tokenizer/tokenizer.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace jambo::chat_template {
class ChatTemplate;
}

namespace jambo::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                 // 0: any free port
  std::string model_name;          // what /v1/models lists and requests must name
  int64_t max_num_requests = 256;  // engine requests accepted at once (running or waiting); more get 429
  int64_t max_num_prompts = 16;    // prompts in one /v1/completions request
  int64_t max_model_len = 4096;
  HttpLimits http;                 // what one connection may send, and how long it may take
  bool enable_control_endpoints = false;  // POST /pause, /resume, /abort_requests, /update_weights_from_disk; GET
                                          // /is_paused (else 404)
  std::vector<std::string> allowed_weight_paths;  // /update_weights_from_disk reads folders under these alone
  std::string api_key;  // non-empty: every route but /health and /metrics needs "Authorization: Bearer <key>" (401)
  bool log_requests = true;          // stderr: one access-log line per HTTP request, once it is answered
  double log_interval_seconds = 10;  // stderr: a throughput and occupancy line this often, when anything ran (0: never)
};

class Server {
 public:
  // chat_template may be null: /v1/chat/completions then answers 400 saying the model has none. `model` is the one
  // the engine was made from: weight updates are checked against it.
  Server(const model::Model& model, engine::Engine& engine, const tokenizer::Tokenizer& tokenizer,
         const chat_template::ChatTemplate* chat_template, int64_t max_n, const ServerOptions& options);
  ~Server();

  // Binds host:port, which no other socket may share (throws jambo::Error naming them and why when it cannot);
  // returns the port.
  int bind();
  void run();   // serves until stop(); the throughput line runs meanwhile
  void stop();  // safe from another thread

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace jambo::server
