#pragma once
// Note [class count]: how many outputs the model's head gets from a data set whose
// classes are integer labels (data.list, webdataset's `cls`, npy's y.npy). One
// corrupted label must not decide it: a `cls` of 999999 among 0..7 made a
// 1,000,000-way head that trained with rc 0. So:
//  - data.classes given: it is the class count; a label outside 0..classes-1 is an
//    error naming where it is;
//  - not given: max label + 1 (at least 2), refused when fewer than half of 0..max
//    occur (most of the head would be classes without a sample), naming the sample
//    that holds the largest label; when some of 0..max are unused but at least half
//    occur, the run goes on and the caller warns, naming the empty classes.
// No LibTorch here.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace batchdist::worker {

/// The class count of `labels` by Note [class count]. `given` > 0: data.classes.
/// `where(i)` names sample i for a message ("y.npy row 17", "list.txt:42",
/// "shard.tar member 000123.cls"). `empty` (may be null) receives the classes below
/// the count with no sample when `given` is 0. Throws ConfigError.
int64_t classCount(const std::vector<int64_t>& labels, int64_t given,
                   const std::function<std::string(int64_t)>& where,
                   std::vector<int64_t>* empty = nullptr);

/// "6", "3, 6 and 9", "3, 6, 9, ... (12 in all)": classes for a message.
std::string classListText(const std::vector<int64_t>& classes);

}  // namespace batchdist::worker
