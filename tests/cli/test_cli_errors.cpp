// The strata binary on bad input: one line "strata: error: ..." naming the file, tensor or
// field; exit status 1; no crash (a crash would show as a signal or an ASan report).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace {

namespace fs = std::filesystem;

struct CliRun {
  int exit_code = -1;
  std::string err;  // stderr
  std::string out;  // stdout
};

CliRun run_strata(const std::string& args) {
  static int counter = 0;
  const std::string err_file =
      fs::temp_directory_path() /
      ("strata_cli_err_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
  const std::string cmd = std::string(STRATA_BINARY) + " " + args + " 2>" + err_file;
  CliRun r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::ifstream in(err_file);
  r.err.assign(std::istreambuf_iterator<char>(in), {});
  fs::remove(err_file);
  return r;
}

std::string fixture(const std::string& name) {
  return std::string(STRATA_FIXTURE_DIR) + "/models/" + name;
}

// A scratch copy of a fixture model that a test may damage.
class ScratchModel {
 public:
  explicit ScratchModel(const std::string& name) {
    char tmpl[] = "/tmp/strata_cli_XXXXXX";
    dir_ = mkdtemp(tmpl);
    for (const auto& e : fs::directory_iterator(fixture(name))) {
      fs::copy(e.path(), dir_ / e.path().filename());
    }
  }
  ~ScratchModel() { fs::remove_all(dir_); }
  std::string path() const { return dir_.string(); }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(dir_ / name, std::ios::binary | std::ios::trunc) << text;
  }
  std::string read(const std::string& name) const {
    std::ifstream in(dir_ / name, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

 private:
  fs::path dir_;
};

void expect_clean_error(const CliRun& r, const std::string& must_contain) {
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err.rfind("strata: error: ", 0), 0u) << r.err;
  // One line.
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(must_contain), std::string::npos)
      << "'" << must_contain << "' not in: " << r.err;
}

TEST(Cli, RunGeneratesText) {
  CliRun r = run_strata("run -m " + fixture("llama") + " -p 'The license is' -n 8 --temp 0 -q");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(r.out.empty());
}

TEST(Cli, InfoPrintsArchitecture) {
  CliRun r = run_strata("info -m " + fixture("qwen2"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Qwen2ForCausalLM"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("parameters"), std::string::npos);
}

TEST(Cli, MissingModelDirectory) {
  expect_clean_error(run_strata("run -m /nonexistent/model -p hi"), "/nonexistent/model");
}

TEST(Cli, UnsupportedArchitecture) {
  ScratchModel m("llama");
  std::string cfg = m.read("config.json");
  cfg.replace(cfg.find("LlamaForCausalLM"), 16, "FooBarForCausalLM");
  m.write("config.json", cfg);
  expect_clean_error(run_strata("run -m " + m.path() + " -p hi"), "FooBarForCausalLM");
}

TEST(Cli, MalformedConfig) {
  ScratchModel m("llama");
  m.write("config.json", "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": ");
  expect_clean_error(run_strata("run -m " + m.path() + " -p hi"), "config.json");
}

TEST(Cli, ConfigFieldWrongType) {
  ScratchModel m("llama");
  std::string cfg = m.read("config.json");
  const size_t at = cfg.find("\"hidden_size\": 64");
  ASSERT_NE(at, std::string::npos);
  cfg.replace(at, 17, "\"hidden_size\": \"64\"");
  m.write("config.json", cfg);
  expect_clean_error(run_strata("run -m " + m.path() + " -p hi"), "hidden_size");
}

TEST(Cli, MissingTensor) {
  ScratchModel m("llama");
  std::string cfg = m.read("config.json");
  const size_t at = cfg.find("\"num_hidden_layers\": 3");
  ASSERT_NE(at, std::string::npos);
  cfg.replace(at, 22, "\"num_hidden_layers\": 4");
  m.write("config.json", cfg);
  expect_clean_error(run_strata("run -m " + m.path() + " -p hi"), "model.layers.3.");
}

TEST(Cli, TruncatedSafetensors) {
  ScratchModel m("llama");
  const std::string data = m.read("model.safetensors");
  m.write("model.safetensors", data.substr(0, data.size() / 2));
  expect_clean_error(run_strata("run -m " + m.path() + " -p hi"), "model.safetensors");
}

TEST(Cli, CorruptSafetensorsHeaderLength) {
  ScratchModel m("llama");
  std::string data = m.read("model.safetensors");
  for (int i = 0; i < 8; ++i) data[static_cast<size_t>(i)] = static_cast<char>(0x7f);
  m.write("model.safetensors", data);
  expect_clean_error(run_strata("run -m " + m.path() + " -p hi"), "model.safetensors");
}

TEST(Cli, PromptLongerThanContext) {
  std::string prompt;
  for (int i = 0; i < 40; ++i) prompt += "the license is ";
  expect_clean_error(run_strata("run -m " + fixture("llama") + " -c 16 -p '" + prompt + "'"),
                     "context length");
}

TEST(Cli, BadSamplingFlag) {
  expect_clean_error(run_strata("run -m " + fixture("llama") + " -p hi --top-p 1.5"), "top_p");
}

TEST(Cli, TensorParallelWithoutMpi) {
  CliRun r = run_strata("run -m " + fixture("llama") + " -p hi --tensor-parallel-size 2");
  // Either MPI is missing from the build, or the world size does not match: a clean error.
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err.rfind("strata: error: ", 0), 0u) << r.err;
}

TEST(Cli, BenchEngineTable) {
  CliRun r = run_strata("bench -m " + fixture("llama") +
                        " --batch 1,3 --ctx 20 --decode-steps 4 --prefill 2x16 -p 8 -r 1 --json -");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // JSON rows: two decode batches, one prefill, one ttft.
  for (const char* key :
       {"\"decode\"", "\"prefill\"", "\"ttft\"", "\"ms_per_step\"", "\"TFLOPs\""}) {
    EXPECT_NE(r.out.find(key), std::string::npos) << key << " missing in " << r.out;
  }
}

TEST(Cli, BenchBadPrefillSpec) {
  expect_clean_error(run_strata("bench -m " + fixture("llama") + " --prefill 2by16"), "2by16");
}

TEST(Cli, DeviceErrors) {
  expect_clean_error(run_strata("run -m " + fixture("llama") + " -p hi --device tpu"), "tpu");
  expect_clean_error(run_strata("run -m " + fixture("llama") + " -p hi --quantization int4"),
                     "int4");
  expect_clean_error(run_strata("run -m " + fixture("llama") + " -p hi --quantization int8"),
                     "--device cuda");
  // Without a GPU (CI) or without CUDA in the build: one clear line either way. With a GPU the
  // unsupported-architecture message is the clean error.
  CliRun r = run_strata("run -m " + fixture("gpt2") + " -p hi --device cuda");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err.rfind("strata: error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  expect_clean_error(run_strata("bench --model-config llama9-1t --batch 1 --device cuda"),
                     "llama9-1t");
}

TEST(Cli, BenchThroughputRunsAllRequests) {
  const std::string json =
      (fs::temp_directory_path() / ("strata_tput_" + std::to_string(getpid()) + ".json")).string();
  CliRun r = run_strata(
      "bench-throughput -m " + fixture("llama") +
      " --num-prompts 40 --input-len 12 --output-len 5 --max-num-seqs 8 --warmup 3 --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream in(json);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  fs::remove(json);
  EXPECT_NE(text.find("\"output_tokens\": 200"), std::string::npos) << text;  // 40 x 5
  EXPECT_NE(r.out.find("output tokens/s"), std::string::npos) << r.out;
}

// `strata info` on mixture-of-experts models: the experts and top-k of a checkpoint and of a
// --model-config preset.
TEST(CliInfo, PrintsExpertsAndTopK) {
  const CliRun ck = run_strata("info -m " + std::string(STRATA_FIXTURE_DIR) + "/moe/qwen2_moe");
  EXPECT_EQ(ck.exit_code, 0) << ck.err;
  EXPECT_NE(ck.out.find("experts        8, top-k 2, expert ffn 20 (2 of 3 layers sparse)"),
            std::string::npos)
      << ck.out;
  EXPECT_NE(ck.out.find("shared expert  ffn 28"), std::string::npos) << ck.out;
  const CliRun q3 = run_strata("info --model-config qwen3-30b-a3b");
  EXPECT_EQ(q3.exit_code, 0) << q3.err;
  EXPECT_NE(q3.out.find("experts        128, top-k 8, expert ffn 768 (48 of 48 layers sparse)"),
            std::string::npos)
      << q3.out;
  const CliRun dense = run_strata("info -m " + fixture("llama"));
  EXPECT_EQ(dense.exit_code, 0) << dense.err;
  EXPECT_EQ(dense.out.find("experts"), std::string::npos) << dense.out;
}

}  // namespace

// ---- strata plan ---------------------------------------------------------------------------

TEST(CliPlan, PrintsRankedLayoutsForAFixtureCheckpoint) {
  // -m reads only the config; the tiny fixture plans on 4 devices.
  const CliRun r = run_strata("plan -m " + fixture("llama") + " --gpus 4 --top 3");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("prefill ("), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("decode ("), std::string::npos) << r.out;
}

TEST(CliPlan, JsonHasBothPhases) {
  const CliRun r = run_strata(
      "plan --model-config palm-540b-padded --profile tpu-v4 --gpus 64 --weights int8 "
      "--workload prompt=2048,gen=64,batch=64 --json --top 2");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\"prefill\""), std::string::npos);
  EXPECT_NE(r.out.find("\"decode\""), std::string::npos);
  EXPECT_NE(r.out.find("\"mfu\""), std::string::npos);
}

TEST(CliPlan, BadInputIsOneLine) {
  expect_clean_error(run_strata("plan --model-config llama3-8b --profile nope"),
                     "--profile 'nope'");
  expect_clean_error(run_strata("plan --model-config llama3-8b --workload prompt=x"), "--workload");
  expect_clean_error(run_strata("plan --model-config llama3-8b --workload size=3"), "size=3");
  expect_clean_error(run_strata("plan --model-config llama3-8b --weights q4"), "q4");
  expect_clean_error(run_strata("plan --model-config no-such"), "no-such");
  expect_clean_error(run_strata("plan"), "--model-config");
  expect_clean_error(run_strata("plan --model-config llama3-8b --gpus 0"), "--gpus 0");
}
