// Questions about a 2×2 grid of Fashion-MNIST garments, and their one-word
// answers: the language of the VQA data (engine/data/vqa_loader.h builds the
// grids). Pure functions of the grid's four labels and one random draw.
//
// Three templates, drawn with equal probability:
//  * "what is at the top left ?" (top/bottom, left/right): the garment there
//    (tshirt, trouser, pullover, dress, coat, sandal, shirt, sneaker, bag, boot);
//  * "is there a bag ?" (any of the ten garments): yes or no, the garment
//    drawn from those in the grid half of the time and from those not in it
//    otherwise, so yes and no are equally likely;
//  * "how many shoes ?": zero .. four, counting sandals, sneakers and ankle boots.
// Words are tokens of a fixed vocabulary (id 0 is padding); a question is
// left-padded to kVqaQuestionTokens, so its last token is always the last
// row and predicts the answer.
//
// Quadrants: 0 top left, 1 top right, 2 bottom left, 3 bottom right.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain {

inline constexpr int kVqaQuestionTokens = 7;  // "what is at the top left ?"
inline constexpr int kVqaGarments = 10;       // Fashion-MNIST's classes
inline constexpr std::int32_t kVqaPad = 0;

enum class VqaQuestionKind { position, existence, count };

struct VqaQuestion {
  VqaQuestionKind kind = VqaQuestionKind::position;
  std::vector<std::int32_t> words;  // (kVqaQuestionTokens) left-padded with kVqaPad
  std::int32_t answer = 0;          // a word id
};

// Every word, by id (id 0 is "<pad>").
const std::vector<std::string>& vqa_vocabulary();
// The id of `word`, or -1.
std::int32_t vqa_word(std::string_view word);
// The answer word of each Fashion-MNIST label (label 9, ankle boot, is "boot").
std::int32_t vqa_garment_word(int label);
bool vqa_is_shoe(int label);  // sandal, sneaker, ankle boot

// The question `draw` (uniform over [0, 2^32)) picks for a grid with these
// labels, and its answer.
VqaQuestion make_vqa_question(const std::array<int, 4>& labels, std::uint64_t draw);
inline constexpr std::uint64_t kVqaQuestionDraws = std::uint64_t{1} << 32;

// "what is at the top left ?" from ids (padding left out).
std::string vqa_text(const std::vector<std::int32_t>& words);

}  // namespace meshtrain
