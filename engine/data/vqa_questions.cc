#include "engine/data/vqa_questions.h"

#include <algorithm>
#include <cassert>

namespace meshtrain {

namespace {

const char* const kGarments[kVqaGarments] = {"tshirt", "trouser", "pullover", "dress",   "coat",
                                             "sandal", "shirt",   "sneaker",  "bag",     "boot"};
const char* const kNumbers[5] = {"zero", "one", "two", "three", "four"};

std::int32_t word(std::string_view w) {
  const std::int32_t id = vqa_word(w);
  assert(id >= 0 && "a template word missing from the vocabulary");
  return id;
}

std::vector<std::int32_t> padded(std::initializer_list<std::string_view> words) {
  std::vector<std::int32_t> out(static_cast<std::size_t>(kVqaQuestionTokens) - words.size(), kVqaPad);
  for (std::string_view w : words) out.push_back(word(w));
  return out;
}

}  // namespace

const std::vector<std::string>& vqa_vocabulary() {
  static const std::vector<std::string> words = [] {
    std::vector<std::string> v = {"<pad>", "what", "is",   "at",   "the",  "top", "bottom", "left",
                                  "right", "there", "a",   "how",  "many", "shoes", "?",    "yes",
                                  "no"};
    for (const char* g : kGarments) v.push_back(g);
    for (const char* n : kNumbers) v.push_back(n);
    return v;
  }();
  return words;
}

std::int32_t vqa_word(std::string_view w) {
  const auto& v = vqa_vocabulary();
  const auto it = std::find(v.begin(), v.end(), w);
  return it == v.end() ? -1 : static_cast<std::int32_t>(it - v.begin());
}

std::int32_t vqa_garment_word(int label) { return word(kGarments[label]); }

bool vqa_is_shoe(int label) { return label == 5 || label == 7 || label == 9; }

VqaQuestion make_vqa_question(const std::array<int, 4>& labels, std::uint64_t draw) {
  VqaQuestion q;
  q.kind = static_cast<VqaQuestionKind>(draw % 3);
  draw /= 3;
  switch (q.kind) {
    case VqaQuestionKind::position: {
      const int quadrant = static_cast<int>(draw % 4);
      const char* row = quadrant < 2 ? "top" : "bottom";
      const char* column = quadrant % 2 ? "right" : "left";
      q.words = padded({"what", "is", "at", "the", row, column, "?"});
      q.answer = vqa_garment_word(labels[static_cast<std::size_t>(quadrant)]);
      break;
    }
    case VqaQuestionKind::existence: {
      // Half the time a garment of the grid (yes), else one it lacks (no): the answers balance.
      std::vector<int> present, absent;
      for (int g = 0; g < kVqaGarments; ++g)
        (std::find(labels.begin(), labels.end(), g) != labels.end() ? present : absent).push_back(g);
      const bool yes = draw % 2 == 0;
      draw /= 2;
      const std::vector<int>& pool = yes ? present : absent;  // present has 1..4, absent 6..9 garments
      const int garment = pool[draw % pool.size()];
      q.words = padded({"is", "there", "a", kGarments[garment], "?"});
      q.answer = word(yes ? "yes" : "no");
      break;
    }
    case VqaQuestionKind::count: {
      const auto shoes = std::count_if(labels.begin(), labels.end(), vqa_is_shoe);
      q.words = padded({"how", "many", "shoes", "?"});
      q.answer = word(kNumbers[shoes]);
      break;
    }
  }
  return q;
}

std::string vqa_text(const std::vector<std::int32_t>& words) {
  std::string out;
  for (std::int32_t w : words) {
    if (w == kVqaPad || w < 0 || w >= static_cast<std::int32_t>(vqa_vocabulary().size())) continue;
    if (!out.empty()) out += ' ';
    out += vqa_vocabulary()[static_cast<std::size_t>(w)];
  }
  return out;
}

}  // namespace meshtrain
