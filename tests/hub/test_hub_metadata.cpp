// The hub's names and JSON answers (src/hub/hub_metadata.h): hub ids, the model API's file
// list, a safetensors index and the file-selection rule. The downloader itself is tested
// against a local stand-in for the hub (tests/hub/test_hub.py).
#include <gtest/gtest.h>

#include <string>

#include "hub/hub.h"
#include "hub/hub_metadata.h"

namespace strata::hub {
namespace {

const std::string kSha = "0123456789abcdef0123456789abcdef01234567";
const std::string kSha256 = "e14d776840bf5cc2b830f9c835e2efb7a5b7d231732ccc082dd7daa389c987e0";

TEST(HubId, Forms) {
  auto id = parse_hub_id("HuggingFaceTB/SmolLM2-135M-Instruct");
  ASSERT_TRUE(id.has_value());
  EXPECT_EQ(id->repo, "HuggingFaceTB/SmolLM2-135M-Instruct");
  EXPECT_EQ(id->rev(), "main");
  EXPECT_TRUE(id->file.empty());
  id = parse_hub_id("org/name@" + kSha);
  ASSERT_TRUE(id.has_value());
  EXPECT_EQ(id->revision, kSha);
  id = parse_hub_id("org/name@v1.0:sub/model-Q4_K_M.gguf");
  ASSERT_TRUE(id.has_value());
  EXPECT_EQ(id->revision, "v1.0");
  EXPECT_EQ(id->file, "sub/model-Q4_K_M.gguf");
  EXPECT_EQ(id->display(), "org/name@v1.0:sub/model-Q4_K_M.gguf");
  id = parse_hub_id("org/name:model.GGUF");
  ASSERT_TRUE(id.has_value());
  EXPECT_EQ(id->file, "model.GGUF");
  EXPECT_EQ(id->rev(), "main");
  EXPECT_TRUE(parse_hub_id("org/name@refs/pr/1").has_value());
}

TEST(HubId, NotHubIds) {
  for (const char* s : {"",
                        "smollm2",
                        "model.gguf",
                        "/abs/path",
                        "./org/name",
                        "a/b/c",
                        "org/",
                        "/name",
                        "org/name@",
                        "org/name:",
                        "org/name:model.bin",
                        "org/name:../x.gguf",
                        "org/na me",
                        "org/-name",
                        "org/name.",
                        "org--x/name",
                        "org/a..b",
                        "org/name@a b",
                        "org/name@..",
                        "org/name@x:/abs.gguf",
                        "C:/models/x.gguf",
                        "tests/fixtures/models/llama"}) {
    EXPECT_FALSE(parse_hub_id(s).has_value()) << s;
  }
  EXPECT_FALSE(parse_hub_id(std::string(97, 'a') + "/b").has_value());
}

TEST(HubId, CacheFolderName) {
  EXPECT_EQ(repo_folder_name("org/name"), "models--org--name");
  EXPECT_EQ(repo_folder_name("HuggingFaceTB/SmolLM2-135M"), "models--HuggingFaceTB--SmolLM2-135M");
}

std::string answer(const std::string& siblings, const std::string& sha = kSha) {
  return R"({"id":"org/name","sha":")" + sha + R"(","siblings":)" + siblings + "}";
}

TEST(RepoInfo, ParsesTheModelApiAnswer) {
  const std::string json =
      answer(R"([{"rfilename":"config.json","blobId":")" + kSha +
             R"(","size":12},{"rfilename":"model.safetensors","size":5,"blobId":")" + kSha +
             R"(","lfs":{"sha256":")" + kSha256 +
             R"(","size":5,"pointerSize":130}},{"rfilename":"README.md"}])");
  auto info = parse_repo_info(json, "URL");
  ASSERT_TRUE(info.ok()) << info.status().message();
  EXPECT_EQ(info->sha, kSha);
  ASSERT_EQ(info->files.size(), 3u);
  EXPECT_EQ(info->files[0].etag(), kSha);
  EXPECT_EQ(info->files[0].size, 12);
  EXPECT_EQ(info->files[1].etag(), kSha256);
  EXPECT_EQ(info->files[2].size, -1);
  EXPECT_TRUE(info->files[2].etag().empty());
  ASSERT_NE(info->find("model.safetensors"), nullptr);
  EXPECT_EQ(info->find("nope"), nullptr);
}

TEST(RepoInfo, MalformedAnswersAreErrorsNamingTheField) {
  const std::pair<std::string, std::string> cases[] = {
      {"", "not valid JSON"},
      {"[]", "not a JSON object"},
      {"{\"sha\":1,\"siblings\":[]}", "'sha'"},
      {answer("[]", "xyz"), "'sha'"},
      {"{\"sha\":\"" + kSha + "\"}", "'siblings'"},
      {answer("{}"), "'siblings'"},
      {answer("[1]"), "siblings[0]"},
      {answer("[{}]"), "siblings[0].rfilename"},
      {answer(R"([{"rfilename":"../etc/passwd"}])"), "not a safe path"},
      {answer(R"([{"rfilename":"/abs"}])"), "not a safe path"},
      {answer(R"([{"rfilename":"a"},{"rfilename":"a"}])"), "listed twice"},
      {answer(R"([{"rfilename":"a","size":-1}])"), "siblings[0].size"},
      {answer(R"([{"rfilename":"a","size":1e300}])"), "siblings[0].size"},
      {answer(R"([{"rfilename":"a","size":"5"}])"), "siblings[0].size"},
      {answer(R"([{"rfilename":"a","size":99999999999999999999}])"), "siblings[0].size"},
      {answer(R"([{"rfilename":"a","blobId":"zz"}])"), "blobId"},
      {answer(R"([{"rfilename":"a","lfs":[]}])"), "siblings[0].lfs"},
      {answer(R"([{"rfilename":"a","lfs":{"sha256":"abc"}}])"), "lfs.sha256"},
      {answer(R"([{"rfilename":"a","size":4,"lfs":{"sha256":")" + kSha256 + R"(","size":5}}])"),
       "lfs.size"},
      {std::string(100000, '[') + std::string(100000, ']'), "nested"},
  };
  for (const auto& [json, want] : cases) {
    auto info = parse_repo_info(json, "URL");
    ASSERT_FALSE(info.ok()) << json.substr(0, 200);
    EXPECT_NE(info.status().message().find(want), std::string::npos)
        << info.status().message() << " (wanted '" << want << "')";
    EXPECT_EQ(info.status().message().rfind("URL: ", 0), 0u) << info.status().message();
    EXPECT_EQ(info.status().message().find('\n'), std::string::npos);
  }
}

TEST(IndexShards, ParsesAndChecks) {
  auto shards = parse_index_shards(
      R"({"metadata":{},"weight_map":{"a":"model-2.safetensors","b":"model-1.safetensors","c":"model-1.safetensors"}})",
      "index");
  ASSERT_TRUE(shards.ok());
  EXPECT_EQ(*shards, (std::vector<std::string>{"model-1.safetensors", "model-2.safetensors"}));
  for (const char* bad :
       {R"({})", R"({"weight_map":{}})", R"({"weight_map":{"a":1}})",
        R"({"weight_map":{"a":"../x.safetensors"}})", R"({"weight_map":{"a":"sub/x.safetensors"}})",
        R"({"weight_map":{"a":"x.bin"}})"}) {
    EXPECT_FALSE(parse_index_shards(bad, "index").ok()) << bad;
  }
}

TEST(SelectFiles, TheRule) {
  const HubId id = *parse_hub_id("org/name");
  auto sel = select_files({"config.json", "model.safetensors", "tokenizer.json", "README.md",
                           "model.gguf", "onnx/model.onnx"},
                          id);
  ASSERT_TRUE(sel.ok());
  EXPECT_EQ(sel->required, (std::vector<std::string>{"config.json", "model.safetensors"}));
  EXPECT_EQ(sel->entry, "");
  EXPECT_FALSE(sel->needs_index);
  EXPECT_EQ(sel->optional.size(), 3u);
  sel = select_files({"config.json", "model.safetensors.index.json", "model-1.safetensors"}, id);
  ASSERT_TRUE(sel.ok());
  EXPECT_TRUE(sel->needs_index);
  // Only GGUF: the only one, or the only Q4_K_M among several.
  sel = select_files({"README.md", "x-Q8_0.gguf"}, id);
  ASSERT_TRUE(sel.ok());
  EXPECT_EQ(sel->entry, "x-Q8_0.gguf");
  sel = select_files({"x-Q8_0.gguf", "x-q4_k_m.gguf", "sub/y-Q4_K_M.gguf"}, id);
  ASSERT_TRUE(sel.ok());
  EXPECT_EQ(sel->entry, "x-q4_k_m.gguf");
  sel = select_files({"x-Q8_0.gguf", "x-F16.gguf"}, id);
  ASSERT_FALSE(sel.ok());
  EXPECT_NE(sel.status().message().find("org/name:FILE.gguf"), std::string::npos);
  EXPECT_FALSE(select_files({"README.md", "config.json"}, id).ok());
  EXPECT_FALSE(select_files({}, id).ok());
  // :FILE picks that file even next to a checkpoint.
  sel = select_files({"config.json", "model.safetensors", "x-F16.gguf"},
                     *parse_hub_id("org/name:x-F16.gguf"));
  ASSERT_TRUE(sel.ok());
  EXPECT_EQ(sel->required, (std::vector<std::string>{"x-F16.gguf"}));
  EXPECT_EQ(sel->entry, "x-F16.gguf");
}

TEST(Resolve, OfflineWithAnEmptyCacheNamesTheRef) {
  HubOptions o;
  o.cache_dir = ::testing::TempDir() + "/strata_hub_empty_cache";
  o.offline = true;
  o.endpoint = "http://127.0.0.1:9";
  auto r = resolve(*parse_hub_id("org/name"), o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("offline"), std::string::npos);
  EXPECT_NE(r.status().message().find("models--org--name/refs/main"), std::string::npos);
}

}  // namespace
}  // namespace strata::hub
