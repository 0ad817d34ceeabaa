// MappedFile's two modes: the file mapped in place, and read into 2 MiB-aligned huge pages
// (MapMode::kHugePageCopy, STRATA_HUGEPAGES=1) must hold the same bytes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/mapped_file.h"

namespace strata {
namespace {

std::string write_file(const std::string& name, const std::vector<uint8_t>& bytes) {
  const std::string path = ::testing::TempDir() + name + "." + std::to_string(::getpid());
  std::FILE* f = std::fopen(path.c_str(), "wb");
  EXPECT_NE(f, nullptr);
  if (!bytes.empty()) EXPECT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
  std::fclose(f);
  return path;
}

TEST(MappedFile, HugePageCopyHoldsTheFilesBytes) {
  // Larger than one huge page and not a multiple of it (the copy is rounded up).
  std::vector<uint8_t> bytes((size_t{3} << 20) + 123);
  std::mt19937 rng(7);
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  const std::string path = write_file("strata_mapped_file", bytes);
  auto mapped = MappedFile::open(path);
  auto copied = MappedFile::open(path, MapMode::kHugePageCopy);
  ASSERT_TRUE(mapped.ok()) << mapped.status().message();
  ASSERT_TRUE(copied.ok()) << copied.status().message();
  ASSERT_EQ((*mapped)->size(), bytes.size());
  ASSERT_EQ((*copied)->size(), bytes.size());
  EXPECT_EQ(std::memcmp((*mapped)->data(), bytes.data(), bytes.size()), 0);
  EXPECT_EQ(std::memcmp((*copied)->data(), bytes.data(), bytes.size()), 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*copied)->data()) % (uintptr_t{2} << 20), 0u);
  std::remove(path.c_str());
}

TEST(MappedFile, EmptyAndMissingFiles) {
  const std::string path = write_file("strata_mapped_empty", {});
  for (const MapMode mode : {MapMode::kMap, MapMode::kHugePageCopy}) {
    auto f = MappedFile::open(path, mode);
    ASSERT_TRUE(f.ok()) << f.status().message();
    EXPECT_EQ((*f)->size(), 0u);
    EXPECT_EQ((*f)->data(), nullptr);
    auto missing = MappedFile::open(path + ".missing", mode);
    ASSERT_FALSE(missing.ok());
    EXPECT_NE(missing.status().message().find(path + ".missing"), std::string::npos);
  }
  std::remove(path.c_str());
}

}  // namespace
}  // namespace strata
