// GGUF reader: metadata and tensor infos of a file written by gguf-py
// (scripts/make_gguf_fixtures.py), and corrupt files built byte by byte here, each of which must
// fail with a message naming the file (and the key or tensor) instead of crashing.
#include "io/gguf.h"

#include <gtest/gtest.h>

#include "model/gguf_model.h"
#include "text/gguf_tokenizer.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

namespace strata {
namespace {

const std::string kFixture = std::string(STRATA_FIXTURE_DIR) + "/gguf/all_types.gguf";

// ---- the gguf-py fixture ------------------------------------------------------------------------

class GgufFixture : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto r = GgufFile::open(kFixture);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    file_ = new GgufFile(std::move(r).value());
  }
  static void TearDownTestSuite() {
    delete file_;
    file_ = nullptr;
  }
  static GgufFile* file_;
};
GgufFile* GgufFixture::file_ = nullptr;

TEST_F(GgufFixture, Header) {
  EXPECT_EQ(file_->version(), 3u);
  EXPECT_EQ(file_->alignment(), 32u);
  EXPECT_EQ(file_->data_offset() % 32, 0u);
  EXPECT_NE(file_->mapping(), nullptr);
  EXPECT_EQ(file_->get_string("general.architecture").value(), "llama");
}

TEST_F(GgufFixture, ScalarMetadataReadsBackExactly) {
  const GgufFile& f = *file_;
  EXPECT_EQ(f.get_u8("test.u8").value(), 200);
  EXPECT_EQ(f.get_i8("test.i8").value(), -100);
  EXPECT_EQ(f.get_u16("test.u16").value(), 65000);
  EXPECT_EQ(f.get_i16("test.i16").value(), -32000);
  EXPECT_EQ(f.get_u32("test.u32").value(), 4000000000u);
  EXPECT_EQ(f.get_i32("test.i32").value(), -2000000000);
  EXPECT_EQ(f.get_u64("test.u64").value(), 18000000000000000000ull);
  EXPECT_EQ(f.get_i64("test.i64").value(), -9000000000000000000ll);
  EXPECT_EQ(f.get_f32("test.f32").value(), 0.1f);
  EXPECT_EQ(f.get_f64("test.f64").value(), 2.718281828459045);
  EXPECT_TRUE(f.get_bool("test.bool_true").value());
  EXPECT_FALSE(f.get_bool("test.bool_false").value());
  EXPECT_EQ(f.get_string("test.string").value(),
            "h\xc3\xa9llo w\xc3\xb6rld \xe2\x98\x83 \"quoted\"\nline2");
  EXPECT_EQ(f.get_u32("llama.block_count").value(), 2u);
  // Lenient getters.
  EXPECT_EQ(f.get_int("test.u16").value(), 65000);
  EXPECT_EQ(f.get_int("test.i8").value(), -100);
  EXPECT_FALSE(f.get_int("test.u64").ok());  // 1.8e19 does not fit in i64
  EXPECT_FLOAT_EQ(static_cast<float>(f.get_float("test.f32").value()), 0.1f);
  // Keys come back in file order.
  ASSERT_GE(f.metadata().size(), 3u);
  EXPECT_EQ(f.metadata()[0].key, "general.architecture");
  EXPECT_EQ(f.metadata()[1].key, "test.u8");
}

TEST_F(GgufFixture, ArrayMetadata) {
  const GgufFile& f = *file_;
  const std::vector<std::string> strs = f.get_string_array("test.string_array").value();
  ASSERT_EQ(strs.size(), 5u);
  EXPECT_EQ(strs[0], "a");
  EXPECT_EQ(strs[1], "");
  EXPECT_EQ(strs[2], "\xc4\xa0the");
  EXPECT_EQ(strs[3], "<|im_end|>");
  EXPECT_EQ(strs[4], std::string(300, 'x'));
  EXPECT_EQ(f.get_i32_array("test.i32_array").value(),
            (std::vector<int32_t>{1, -2, 3, 2147483647, -2147483647 - 1}));
  EXPECT_EQ(f.get_f32_array("test.f32_array").value(), (std::vector<float>{0.5f, -1.25f, 3.0e-5f}));
  EXPECT_EQ(f.get_int_array("test.u8_array").value(), (std::vector<int64_t>{0, 1, 255}));
  EXPECT_EQ(f.get_int_array("test.i64_array").value(),
            (std::vector<int64_t>{-(int64_t{1} << 40), int64_t{1} << 40}));
  const GgufValue* b = f.find("test.bool_array");
  ASSERT_NE(b, nullptr);
  ASSERT_EQ(b->elem_type(), GgufType::kBool);
  ASSERT_EQ(b->array_size(), 3u);
  EXPECT_EQ(b->raw_items(), (std::vector<uint8_t>{1, 0, 1}));
  EXPECT_TRUE(b->item(0).as_bool());
  EXPECT_FALSE(b->item(1).as_bool());
  EXPECT_EQ(b->item(1).type(), GgufType::kBool);
  EXPECT_EQ(f.find("test.i32_array")->item(3).as_int(), 2147483647);
  EXPECT_EQ(f.find("test.f32_array")->item(1).as_float(), -1.25);
  EXPECT_EQ(f.find("test.string_array")->item(2).as_string(), "\xc4\xa0the");
  EXPECT_EQ(f.find("test.string_array")->to_string(2), "string[5] [\"a\", \"\", ...]");

  const GgufValue* nested = f.find("test.nested");
  ASSERT_NE(nested, nullptr);
  ASSERT_EQ(nested->type(), GgufType::kArray);
  ASSERT_EQ(nested->elem_type(), GgufType::kArray);
  const auto& outer = nested->as_array();
  ASSERT_EQ(outer.size(), 3u);
  EXPECT_EQ(outer[0].elem_type(), GgufType::kString);
  ASSERT_EQ(outer[2].array_size(), 3u);
  EXPECT_EQ(outer[2].as_strings()[1], "e");
  EXPECT_EQ(nested->item(1).item(0).as_string(), "c");
}

TEST_F(GgufFixture, KeyErrorsNameFileKeyAndTypes) {
  const GgufFile& f = *file_;
  auto missing = f.get_u32("llama.context_length");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("all_types.gguf"), std::string::npos);
  EXPECT_NE(missing.status().message().find("'llama.context_length' missing"), std::string::npos);

  auto wrong = f.get_u32("test.i32");
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("key 'test.i32' has type i32, expected u32"),
            std::string::npos)
      << wrong.status().message();
  auto wrong_arr = f.get_string_array("test.i32_array");
  ASSERT_FALSE(wrong_arr.ok());
  EXPECT_NE(wrong_arr.status().message().find("has type array of i32, expected array of string"),
            std::string::npos)
      << wrong_arr.status().message();
  EXPECT_FALSE(f.get_string("test.u8").ok());
  EXPECT_FALSE(f.get_f32("test.f64").ok());
}

TEST_F(GgufFixture, TensorShapesAreOutermostFirst) {
  const GgufFile& f = *file_;
  const char* kTypes[] = {"f32",  "f16",  "bf16", "q8_0", "q4_0", "q4_1",
                          "q5_0", "q5_1", "q4_k", "q5_k", "q6_k"};
  const DType kDTypes[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0,
                           DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,
                           DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};
  EXPECT_EQ(f.tensor_infos().size(), 2 * std::size(kTypes) + 1);
  for (size_t i = 0; i < std::size(kTypes); ++i) {
    for (const char* tag : {"a", "b"}) {
      const std::string name = std::string(kTypes[i]) + "." + tag;
      auto t = f.tensor(name);
      ASSERT_TRUE(t.ok()) << t.status().to_string();
      EXPECT_EQ(t->dtype, kDTypes[i]) << name;
      ASSERT_EQ(t->ndim, 2) << name;
      const bool a = tag[0] == 'a';
      EXPECT_EQ(t->shape[0], a ? 7 : 3) << name;
      EXPECT_EQ(t->shape[1], a ? 256 : 512) << name;
      EXPECT_EQ(t->stride[0], a ? 256 : 512);
      EXPECT_EQ(t->stride[1], 1);
      EXPECT_TRUE(t->is_contiguous());
      EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data) % 32, 0u) << name;
      const GgufTensorInfo* info = f.find_tensor(name);
      ASSERT_NE(info, nullptr);
      EXPECT_EQ(static_cast<int64_t>(info->bytes), t->nbytes()) << name;
      // In place: the view points into the map.
      EXPECT_EQ(t->data, f.mapping()->data() + f.data_offset() + info->offset);
    }
  }
  auto t3 = f.tensor("f32.3d");
  ASSERT_TRUE(t3.ok());
  EXPECT_EQ(t3->shape_string(), "[2, 3, 4]");
  // numpy arange(24).reshape(2, 3, 4): element [i, j, k] = 12 i + 4 j + k.
  const float* v = t3->ptr<float>();
  EXPECT_EQ(v[1 * 12 + 2 * 4 + 3], 23.0f);
  EXPECT_EQ(v[5], 5.0f);

  auto none = f.tensor("nope");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("all_types.gguf: tensor 'nope' not found"),
            std::string::npos);
}

// ---- a byte-level GGUF builder for valid and corrupt files --------------------------------------

class Builder {
 public:
  struct Info {
    std::string name;
    std::vector<uint64_t> ne;  // innermost-first, as in the file
    uint32_t type = 0;
    uint64_t offset = 0;
  };

  uint32_t version = 3;
  uint64_t alignment = 32;
  int64_t tensor_count_override = -1;
  int64_t kv_count_override = -1;
  std::vector<Info> tensors;
  uint64_t data_bytes = 0;

  template <class T>
  static void put(std::vector<uint8_t>& b, T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
  }
  static void put_str(std::vector<uint8_t>& b, const std::string& s) {
    put<uint64_t>(b, s.size());
    b.insert(b.end(), s.begin(), s.end());
  }
  void kv_u32(const std::string& key, uint32_t v) {
    put_str(kv_, key);
    put<uint32_t>(kv_, 4);
    put<uint32_t>(kv_, v);
    ++n_kv_;
  }
  void kv_str(const std::string& key, const std::string& v) {
    put_str(kv_, key);
    put<uint32_t>(kv_, 8);
    put_str(kv_, v);
    ++n_kv_;
  }
  // Raw value bytes after the key (type id included).
  void kv_raw(const std::string& key, const std::vector<uint8_t>& typed_value) {
    put_str(kv_, key);
    kv_.insert(kv_.end(), typed_value.begin(), typed_value.end());
    ++n_kv_;
  }
  void tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
    tensors.push_back({name, std::move(ne), type, offset});
  }

  std::vector<uint8_t> build() const {
    std::vector<uint8_t> b;
    put<uint32_t>(b, 0x46554747u);
    put<uint32_t>(b, version);
    put<uint64_t>(b, tensor_count_override >= 0 ? static_cast<uint64_t>(tensor_count_override)
                                                : tensors.size());
    put<uint64_t>(b, kv_count_override >= 0 ? static_cast<uint64_t>(kv_count_override) : n_kv_);
    b.insert(b.end(), kv_.begin(), kv_.end());
    for (const Info& t : tensors) {
      put_str(b, t.name);
      put<uint32_t>(b, static_cast<uint32_t>(t.ne.size()));
      for (uint64_t d : t.ne) put<uint64_t>(b, d);
      put<uint32_t>(b, t.type);
      put<uint64_t>(b, t.offset);
    }
    while (b.size() % alignment != 0) b.push_back(0);
    for (uint64_t i = 0; i < data_bytes; ++i) b.push_back(static_cast<uint8_t>(i * 7));
    return b;
  }

 private:
  std::vector<uint8_t> kv_;
  uint64_t n_kv_ = 0;
};

// Two f32 tensors [2, 8] and [4] and one q4_0 [1, 32] (18 bytes) back to back.
Builder valid_builder() {
  Builder b;
  b.kv_str("general.architecture", "llama");
  b.kv_u32("llama.block_count", 1);
  b.tensor("a", {8, 2}, 0, 0);    // 64 bytes
  b.tensor("b", {4}, 0, 64);      // 16 bytes
  b.tensor("q", {32, 1}, 2, 96);  // 18 bytes
  b.data_bytes = 96 + 18;
  return b;
}

std::string write_temp(const std::string& name, const std::vector<uint8_t>& bytes) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  return path;
}

// Open `bytes` as a file named `name`; expect failure whose message contains the file name
// and `needle`.
void expect_open_error(const std::string& name, const std::vector<uint8_t>& bytes,
                       const std::string& needle) {
  const std::string path = write_temp(name, bytes);
  auto r = GgufFile::open(path);
  ASSERT_FALSE(r.ok()) << name << " parsed";
  const std::string& msg = r.status().message();
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg << "\nexpected: " << needle;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
  std::remove(path.c_str());
}

TEST(GgufBuilt, ValidFileParses) {
  const std::vector<uint8_t> bytes = valid_builder().build();
  auto r = GgufFile::parse(bytes.data(), bytes.size(), "mem.gguf");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->tensor_infos().size(), 3u);
  auto a = r->tensor("a");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->shape_string(), "[2, 8]");
  EXPECT_EQ(r->tensor("q")->dtype, DType::kQ4_0);
  EXPECT_EQ(r->mapping(), nullptr);
}

TEST(GgufBuilt, Version2Parses) {
  Builder b = valid_builder();
  b.version = 2;
  const std::vector<uint8_t> bytes = b.build();
  auto r = GgufFile::parse(bytes.data(), bytes.size(), "v2.gguf");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->version(), 2u);
}

TEST(GgufBuilt, CustomAlignment) {
  Builder b;
  b.alignment = 64;
  std::vector<uint8_t> v;
  Builder::put<uint32_t>(v, 4);
  Builder::put<uint32_t>(v, 64);
  b.kv_raw("general.alignment", v);
  b.tensor("a", {16}, 0, 0);
  b.tensor("b", {16}, 0, 64);
  b.data_bytes = 128;
  const std::vector<uint8_t> bytes = b.build();
  auto r = GgufFile::parse(bytes.data(), bytes.size(), "align.gguf");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->alignment(), 64u);
  EXPECT_EQ(r->data_offset() % 64, 0u);
}

TEST(GgufBuilt, UnsupportedTypeParsesButErrorsWhenRequested) {
  Builder b;
  b.tensor("iq", {256, 2}, 16, 0);  // iq2_xxs: 66 bytes per 256
  b.data_bytes = 132;
  const std::vector<uint8_t> bytes = b.build();
  auto r = GgufFile::parse(bytes.data(), bytes.size(), "iq.gguf");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->find_tensor("iq")->bytes, 132u);
  EXPECT_FALSE(r->find_tensor("iq")->dtype.has_value());
  auto t = r->tensor("iq");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(t.status().message().find("iq.gguf: tensor 'iq' has ggml type iq2_xxs"),
            std::string::npos)
      << t.status().message();
}

TEST(GgufCorrupt, BadMagic) {
  std::vector<uint8_t> bytes = valid_builder().build();
  bytes[3] = 'X';
  expect_open_error("bad_magic.gguf", bytes, "not a GGUF file");
}

TEST(GgufCorrupt, Version1Rejected) {
  Builder b = valid_builder();
  b.version = 1;
  expect_open_error("v1.gguf", b.build(), "GGUF version 1 is not supported");
}

TEST(GgufCorrupt, FutureAndBigEndianVersions) {
  Builder b = valid_builder();
  b.version = 4;
  expect_open_error("v4.gguf", b.build(), "GGUF version 4 is not supported");
  b.version = 0x03000000u;
  expect_open_error("be.gguf", b.build(), "big-endian");
}

TEST(GgufCorrupt, HugeCounts) {
  Builder b = valid_builder();
  b.tensor_count_override = int64_t{1} << 60;
  expect_open_error("tensor_count.gguf", b.build(), "tensor count 1152921504606846976 cannot fit");
  b = valid_builder();
  b.kv_count_override = int64_t{1} << 40;
  expect_open_error("kv_count.gguf", b.build(), "metadata count");
}

TEST(GgufCorrupt, StringLengthPastEof) {
  Builder b = valid_builder();
  std::vector<uint8_t> v;
  Builder::put<uint32_t>(v, 8);
  Builder::put<uint64_t>(v, 1ull << 50);
  b.kv_raw("general.name", v);
  expect_open_error("strlen.gguf", b.build(), "string length 1125899906842624");
  // A key name whose length runs past the end.
  std::vector<uint8_t> bytes = valid_builder().build();
  const uint64_t huge = 1ull << 33;
  std::memcpy(bytes.data() + 24, &huge, 8);  // first key's length
  expect_open_error("keylen.gguf", bytes, "runs past the end of the file");
}

TEST(GgufCorrupt, HugeArrayCount) {
  Builder b = valid_builder();
  std::vector<uint8_t> v;
  Builder::put<uint32_t>(v, 9);  // array
  Builder::put<uint32_t>(v, 8);  // of strings
  Builder::put<uint64_t>(v, 1ull << 40);
  b.kv_raw("tokenizer.ggml.tokens", v);
  expect_open_error("arrcount.gguf", b.build(), "key 'tokenizer.ggml.tokens': array count");
}

TEST(GgufCorrupt, BadValueTypes) {
  Builder b = valid_builder();
  std::vector<uint8_t> v;
  Builder::put<uint32_t>(v, 13);
  Builder::put<uint32_t>(v, 0);
  b.kv_raw("weird", v);
  expect_open_error("valtype.gguf", b.build(), "key 'weird' at byte");

  b = valid_builder();
  v.clear();
  Builder::put<uint32_t>(v, 7);
  Builder::put<uint8_t>(v, 2);
  b.kv_raw("flag", v);
  expect_open_error("bool.gguf", b.build(), "key 'flag': bool");

  b = valid_builder();
  v.clear();
  Builder::put<uint32_t>(v, 9);
  Builder::put<uint32_t>(v, 7);
  Builder::put<uint64_t>(v, 3);
  for (uint8_t x : {0, 1, 5}) Builder::put<uint8_t>(v, x);
  b.kv_raw("flags", v);
  expect_open_error("boolarr.gguf", b.build(), "key 'flags': bool");

  b = valid_builder();
  v.clear();
  Builder::put<uint32_t>(v, 9);
  for (int i = 0; i < 20; ++i) {   // 20 nested arrays of one element each
    Builder::put<uint32_t>(v, 9);  // element type: array
    Builder::put<uint64_t>(v, 1);  // one element
  }
  Builder::put<uint32_t>(v, 0);
  Builder::put<uint64_t>(v, 0);
  b.kv_raw("deep", v);
  expect_open_error("deep.gguf", b.build(), "nested deeper");
}

TEST(GgufCorrupt, DuplicateKeyAndTensorName) {
  Builder b = valid_builder();
  b.kv_u32("llama.block_count", 2);
  expect_open_error("dupkey.gguf", b.build(), "duplicate metadata key 'llama.block_count'");
  b = valid_builder();
  b.tensor("a", {4}, 0, 128);
  b.data_bytes = 160;
  expect_open_error("dupname.gguf", b.build(), "duplicate tensor name 'a'");
}

TEST(GgufCorrupt, BadAlignment) {
  Builder b = valid_builder();
  std::vector<uint8_t> v;
  Builder::put<uint32_t>(v, 4);
  Builder::put<uint32_t>(v, 48);
  b.kv_raw("general.alignment", v);
  expect_open_error("align48.gguf", b.build(), "'general.alignment' is 48");
  b = valid_builder();
  b.kv_str("general.alignment", "32");
  expect_open_error("alignstr.gguf", b.build(), "expected a power of two");
}

TEST(GgufCorrupt, TooManyDims) {
  Builder b = valid_builder();
  b.tensor("five", {1, 1, 1, 1, 1}, 0, 128);
  b.data_bytes = 160;
  expect_open_error("dims5.gguf", b.build(), "tensor 'five' has 5 dims (at most 4)");
}

TEST(GgufCorrupt, UnknownTypeId) {
  Builder b = valid_builder();
  b.tensors[1].type = 99;
  expect_open_error("type99.gguf", b.build(), "tensor 'b' has unknown ggml type id 99");
}

TEST(GgufCorrupt, RowNotWholeBlocks) {
  Builder b = valid_builder();
  b.tensors[2].ne = {48, 1};
  expect_open_error("rowblk.gguf", b.build(), "tensor 'q' (q4_0) has rows of 48 values");
}

TEST(GgufCorrupt, MisalignedOffset) {
  Builder b = valid_builder();
  b.tensors[1].offset = 80;
  expect_open_error("misaligned.gguf", b.build(),
                    "tensor 'b' data offset 80 is not a multiple of the alignment 32");
}

TEST(GgufCorrupt, OverlappingTensors) {
  Builder b = valid_builder();
  b.tensors[1].offset = 32;  // inside a's 64 bytes
  expect_open_error("overlap.gguf", b.build(), "tensors 'a' [0, +64) and 'b' [32, +16) overlap");
}

TEST(GgufCorrupt, TensorDataPastEof) {
  Builder b = valid_builder();
  b.data_bytes = 100;  // q needs [96, 114)
  expect_open_error("short.gguf", b.build(), "tensor 'q' data [96, +18) runs past the end");
  b = valid_builder();
  b.tensors[0].ne = {1ull << 40, 1ull << 30};
  expect_open_error("absurd.gguf", b.build(), "tensor 'a' has absurd dims");
  // Found by the fuzzer: a byte size that wraps to 0 in 64 bits, and a zero dim hiding
  // dims whose product overflows int64_t (Tensor::numel).
  b = valid_builder();
  b.tensors[1].ne = {1ull << 62};
  expect_open_error("wrap.gguf", b.build(), "tensor 'b' has absurd dims");
  b = valid_builder();
  b.tensors[1].ne = {4, 0, 1ull << 40, 1ull << 30};
  expect_open_error("zerodim.gguf", b.build(), "tensor 'b' has absurd dims");
  b = valid_builder();
  b.tensors[2].offset = 1ull << 62;
  expect_open_error("faroff.gguf", b.build(), "tensor 'q' data");
}

TEST(GgufCorrupt, EveryTruncationFailsCleanly) {
  const std::vector<uint8_t> bytes = valid_builder().build();
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto r = GgufFile::parse(bytes.data(), n, "cut.gguf");
    ASSERT_FALSE(r.ok()) << "prefix of " << n << " bytes parsed";
    EXPECT_EQ(r.status().message().rfind("cut.gguf: ", 0), 0u) << r.status().message();
  }
  auto whole = GgufFile::parse(bytes.data(), bytes.size(), "whole.gguf");
  EXPECT_TRUE(whole.ok());
}

TEST(GgufCorrupt, MissingFile) {
  auto r = GgufFile::open("/nonexistent/dir/model.gguf");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("/nonexistent/dir/model.gguf"), std::string::npos);
}

// ---- model metadata checks (issue 16 items 3 and 8)
// ----------------------------------------------

// A minimal llama GGUF: hidden 8, 2 heads, one layer, vocabulary 16; `extra` adds keys.
std::vector<uint8_t> llama_gguf(const std::function<void(Builder&)>& extra) {
  Builder b;
  b.kv_str("general.architecture", "llama");
  b.kv_u32("llama.embedding_length", 8);
  b.kv_u32("llama.block_count", 1);
  b.kv_u32("llama.feed_forward_length", 16);
  b.kv_u32("llama.attention.head_count", 2);
  extra(b);
  b.tensor("token_embd.weight", {8, 16}, 0, 0);
  b.data_bytes = 8 * 16 * 4;
  return b.build();
}

std::vector<uint8_t> f32_value(float v) {
  std::vector<uint8_t> out;
  Builder::put<uint32_t>(out, 6);  // GGUF_TYPE_FLOAT32
  Builder::put<float>(out, v);
  return out;
}

Status gguf_model_status(const std::vector<uint8_t>& bytes) {
  auto f = GgufFile::parse(bytes.data(), bytes.size(), "model.gguf");
  if (!f.ok()) return f.status();
  return model_config_from_gguf(*f).status();
}

// A GGUF string array value (type id included).
std::vector<uint8_t> str_array(const std::vector<std::string>& items) {
  std::vector<uint8_t> out;
  Builder::put<uint32_t>(out, 9);  // GGUF_TYPE_ARRAY
  Builder::put<uint32_t>(out, 8);  // of GGUF_TYPE_STRING
  Builder::put<uint64_t>(out, items.size());
  for (const auto& s : items) Builder::put_str(out, s);
  return out;
}

// Item 8: a malformed GGUF merge names the file and the key with its index.
TEST(GgufModel, MergeErrorsNameFileAndKey) {
  const std::vector<uint8_t> bytes = llama_gguf([](Builder& b) {
    b.kv_str("tokenizer.ggml.model", "gpt2");
    b.kv_raw("tokenizer.ggml.tokens", str_array({"a", "b", "ab"}));
    b.kv_raw("tokenizer.ggml.merges", str_array({"a b", "ab"}));
  });
  auto f = GgufFile::parse(bytes.data(), bytes.size(), "tok.gguf");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  auto spec = tokenizer_spec_from_gguf(*f);
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.status().message().find("tok.gguf: tokenizer.ggml.merges[1]"), std::string::npos)
      << spec.status().message();
}

TEST(GgufModel, RopeValuesAreChecked) {
  EXPECT_TRUE(gguf_model_status(llama_gguf([](Builder&) {})).ok());
  EXPECT_TRUE(gguf_model_status(llama_gguf([](Builder& b) {
                b.kv_raw("llama.rope.freq_base", f32_value(500000.0f));
              })).ok());
  for (float bad : {std::nanf(""), 0.0f, -10000.0f, INFINITY}) {
    const Status s = gguf_model_status(
        llama_gguf([&](Builder& b) { b.kv_raw("llama.rope.freq_base", f32_value(bad)); }));
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("model.gguf: llama.rope.freq_base"), std::string::npos)
        << s.message();
  }
  const Status scale = gguf_model_status(llama_gguf([](Builder& b) {
    b.kv_str("llama.rope.scaling.type", "linear");
    b.kv_raw("llama.rope.scaling.factor", f32_value(0.0f));
  }));
  ASSERT_FALSE(scale.ok());
  EXPECT_NE(scale.message().find("model.gguf: llama.rope.scaling.factor"), std::string::npos)
      << scale.message();
  // An oversized rotary dimension fails at load (not at the first forward), naming the key.
  for (uint32_t dim : {4096u, 6u, 3u}) {
    const Status s = gguf_model_status(
        llama_gguf([&](Builder& b) { b.kv_u32("llama.rope.dimension_count", dim); }));
    ASSERT_FALSE(s.ok()) << dim;
    EXPECT_NE(s.message().find("model.gguf: llama.rope.dimension_count"), std::string::npos)
        << s.message();
  }
  // eos outside the vocabulary (16 rows).
  const Status eos = gguf_model_status(
      llama_gguf([](Builder& b) { b.kv_u32("tokenizer.ggml.eos_token_id", 16); }));
  ASSERT_FALSE(eos.ok());
  EXPECT_NE(eos.message().find("eos_token_id 16"), std::string::npos) << eos.message();
}

}  // namespace
}  // namespace strata
