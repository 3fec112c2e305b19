// jambo serve: the OpenAI-compatible HTTP server over one engine. Stops cleanly on SIGINT or SIGTERM.
#include "cli/common.h"
#include "chat_template/chat_template.h"
#include "server/server.h"

#include <fmt/format.h>

#include <csignal>
#include <filesystem>
#include <pthread.h>
#include <thread>

namespace jambo::cli {
namespace {

struct ServeOptions {
  ModelOptions model;
  EngineFlags engine;
  server::ServerOptions server;
  bool quiet = false;
};

// The chat template of the model folder, or none (a warning) when tokenizer_config.json has none.
std::optional<chat_template::ChatTemplate> load_chat_template(const std::string& folder) {
  try {
    return chat_template::ChatTemplate::load(folder);
  } catch (const Error& error) {
    fmt::print(stderr, "jambo: warning: /v1/chat/completions is off: {}\n", error.what());
    return std::nullopt;
  }
}

void run_serve(const ServeOptions& options) {
  // Signals go to one waiting thread, not to whichever thread they hit; a client that left must not
  // kill the server with SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  const model::Model model = options.model.load(options.engine.options.backend.kind);
  const std::optional<tokenizer::Tokenizer> tokenizer = options.model.load_tokenizer();
  JAMBO_REQUIRE(tokenizer, "model folder '{}' has no tokenizer.json; the server needs one", options.model.folder);
  const std::optional<chat_template::ChatTemplate> chat_template = load_chat_template(options.model.folder);
  const engine::EngineOptions& engine_options = options.engine.options;
  engine::Engine engine(model, &*tokenizer, engine_options);

  server::ServerOptions server_options = options.server;
  if (server_options.model_name.empty())
    server_options.model_name = std::filesystem::path(options.model.folder).lexically_normal().filename().string();
  if (server_options.model_name.empty()) server_options.model_name = options.model.folder;
  server_options.max_model_len = engine.max_model_len();
  if (options.quiet) {
    server_options.log_requests = false;
    server_options.log_interval_seconds = 0;
  }
  const int64_t max_n = engine.counters().slots_total;
  server::Server server(model, engine, *tokenizer, chat_template ? &*chat_template : nullptr, max_n, server_options);
  const int port = server.bind();
  fmt::print("jambo: serving {} on http://{}:{} ({} backend, {} state slots, {} KV blocks; prefix caching {})\n",
             server_options.model_name, server_options.host, port, name(engine_options.backend.kind), max_n,
             engine.counters().kv_blocks_total, engine.prefix_caching_status());
  std::fflush(stdout);
  if (server_options.enable_control_endpoints && server_options.api_key.empty())
    fmt::print(stderr, "jambo: warning: the control endpoints (/pause, /resume, /abort_requests, "
                       "/update_weights_from_disk, /update_weights_from_ipc, /sleep, /wake_up, /reset_prefix_cache) "
                       "are served without --api-key: anyone who reaches {}:{} can pause, abort or put to sleep the "
                       "server, or change its weights\n",
               server_options.host, port);

  std::thread stopper([&] {
    int signal = 0;
    sigwait(&stop_signals, &signal);
    server.stop();
  });
  server.run();
  pthread_kill(stopper.native_handle(), SIGTERM);  // wakes it when the server stopped for another reason
  stopper.join();
  fmt::print("jambo: server stopped\n");
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto options = std::make_shared<ServeOptions>();
  CLI::App* command = app.add_subcommand("serve", "serve the OpenAI-compatible HTTP API");
  options->model.add_to(*command, /*allow_random_weights=*/true);
  options->engine.add_to(*command);
  server::ServerOptions& server = options->server;
  command->add_option("--host", server.host, "address to listen on")->capture_default_str();
  command->add_option("--port", server.port, "port to listen on (0: any free port)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  command->add_option("--served-model-name", server.model_name, "the model's name in the API (default: folder name)");
  command
      ->add_option("--max-num-requests", server.max_num_requests,
                   "requests held at once (running or waiting); more are answered 429")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 16))
      ->capture_default_str();
  command
      ->add_option("--log-interval", server.log_interval_seconds,
                   "seconds between throughput and occupancy lines on stderr, when anything ran (0: none)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  command->add_flag("--enable-control-endpoints", server.enable_control_endpoints,
                    "serve POST /pause, /resume, /abort_requests, /update_weights_from_disk, /update_weights_from_ipc, "
                    "/sleep, /wake_up and GET /is_paused, /is_sleeping, which a trainer drives (give --api-key too: "
                    "without one, anyone who reaches the port can pause the server or change its weights)");
  command
      ->add_option("--allowed-weight-paths", server.allowed_weight_paths,
                   "folders whose checkpoints POST /update_weights_from_disk may read (none: it reads none)")
      ->check(CLI::ExistingDirectory);
  command
      ->add_option("--api-key", server.api_key,
                   "every route but /health and /metrics needs 'Authorization: Bearer KEY' (default: $JAMBO_API_KEY)")
      ->envname("JAMBO_API_KEY");
  command->add_flag("--quiet", options->quiet, "no access log and no throughput lines on stderr");
  command->callback([options] { run_serve(*options); });
}

}  // namespace jambo::cli
