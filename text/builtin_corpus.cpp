// The text the tokenizers of `rlforge init-model` are trained on. Written for rlforge: short
// passages of plain English prose, dialogue, numbers and a little arithmetic, so that the common
// words of small test conversations (and of the example environments) become single tokens.
#include "text/model_tokenizer.hpp"

namespace rlforge::text {

namespace {

constexpr std::string_view corpus_text = R"corpus(
The morning was quiet in the small town by the river. A baker opened the shop before the sun came
up, and the smell of fresh bread moved slowly along the street. People walked to work, children
walked to school, and an old dog slept in the warm light near the door.

Every day the baker made the same things: round loaves, long loaves, small rolls and a sweet cake
with apples. On Fridays there was also a cake with honey and nuts. The baker liked the work because
it was simple and honest. You mix the flour, the water, the salt and the yeast; you wait; you shape
the dough; you wait again; and then the oven does the rest.

"Good morning," said the first customer. "Two loaves, please, and one of the apple cakes."
"Good morning to you," said the baker. "That will be seven coins."
"Here you are. The bread smells wonderful today."
"Thank you. I started a little earlier than usual, so it had more time to rise."

In the afternoon the town was busy. The market square filled with tables of fruit, vegetables,
cheese, fish and flowers. Farmers came from the hills with their carts, and traders came from the
city with cloth, tools and books. Some people came only to talk, to listen to the music, or to sit
by the fountain and watch the others.

A teacher brought her class to the market to practise counting. "How many apples are on this
table?" she asked. The children counted together: one, two, three, four, five, six, seven, eight,
nine, ten, eleven, twelve. "Twelve apples," said a boy. "And if we buy three of them, how many are
left?" "Nine," said a girl at once. "Very good. And if each apple costs two coins, how much do three
apples cost?" "Six coins." The teacher smiled, and they moved on to the next table.

Numbers are everywhere once you start to look for them. There are 7 days in a week, 12 months in a
year, 24 hours in a day, 60 minutes in an hour and 60 seconds in a minute. A year has 365 days, or
366 in a leap year. Water freezes at 0 degrees and boils at 100 degrees. A dozen is 12, a score is
20, and a century is 100 years.

Some simple sums: 1 + 1 = 2. 2 + 3 = 5. 4 + 4 = 8. 7 + 5 = 12. 9 + 8 = 17. 12 + 15 = 27.
23 + 19 = 42. 37 + 48 = 85. 50 + 50 = 100. 64 + 36 = 100. 99 + 1 = 100.
Some differences: 10 - 3 = 7. 15 - 6 = 9. 20 - 11 = 9. 42 - 17 = 25. 100 - 64 = 36. 81 - 9 = 72.
Some products: 2 * 3 = 6. 4 * 5 = 20. 6 * 7 = 42. 8 * 8 = 64. 9 * 9 = 81. 10 * 10 = 100.

Let us play a game. I am thinking of a number between 1 and 100, and you have to guess it. After
each guess I will tell you whether my number is higher or lower than your guess. Try to find it in
as few guesses as you can. Answer with a number.

My first guess is 50.
Higher than 50.
Then I guess 75.
Lower than 75.
My next guess is 62.
Higher than 62.
I guess 68.
Lower than 68.
Is it 65?
Higher than 65.
Then it must be 66 or 67. I guess 66.
Correct! The number was 66.

A good way to play is to guess the middle of the numbers that are still possible. The first guess
is 50. If the answer is higher, the number is between 51 and 100, so the next guess is 75. If the
answer is lower, the number is between 1 and 49, so the next guess is 25. Each guess cuts the
possible numbers in half, so seven guesses are always enough for a number between 1 and 100.

Another round. I am thinking of a number between 1 and 100. You have 5 guesses.
I guess 50.
Lower than 50.
I guess 25.
Higher than 25.
I guess 37.
Higher than 37.
I guess 43.
Lower than 43.
I guess 40.
Out of guesses: the number was 41.
That was close. Let us play again, and this time I will think more carefully about each answer.

The user asked the assistant a question, and the assistant answered it. A helpful assistant reads
the question carefully, thinks about what the user needs, and then gives a short and clear answer.
When the assistant does not know something, it says so, and it does not make things up. When the
question is unclear, it asks what the user meant.

User: What is the capital of the country where the river flows into the sea?
Assistant: I need a little more information. Which river do you mean?
User: Sorry, I was thinking of the long river in the north.
Assistant: Then the city you are looking for is the old port at its mouth. It has been the capital
for a long time.
User: Thank you. Can you also tell me how far it is from here?
Assistant: I do not know where you are, so I cannot say how far it is. If you tell me your town, I
can help you work it out.

A conversation is written as a list of turns, each with its role on a line of its own:
system
You are a helpful assistant. Answer briefly.
user
What is 6 + 7?
assistant
6 + 7 = 13.
user
And 13 + 29?
assistant
13 + 29 = 42.
user
Thank you!
assistant
You are welcome.

The weather changed in the evening. Clouds came in from the west, the wind grew stronger, and soon
it began to rain. The traders covered their tables, the farmers turned their carts toward the
hills, and the children ran home through the puddles. By night the streets were empty and the only
sound was the rain on the roofs.

In the library on the hill a student was still reading. She was learning how computers store text.
A computer keeps every letter as a number, she read, and a word is a list of such numbers. To teach
a model about language, we first cut the text into small pieces called tokens, and each token gets
a number of its own. Common words become one token, rare words are split into several, and any text
at all can still be written with the tokens for single bytes.

She wrote in her notebook: the model reads a list of token numbers and predicts the next one. It
does this again and again, one token at a time, until it writes a special token that means the end
of the text, or until it has written as many tokens as it was allowed. Then the numbers are turned
back into letters, and we can read what the model wrote.

The next morning was bright and clear. The rain had washed the streets, the river was high and
fast, and the air was cool and fresh. The baker opened the shop again, and the first customer came
in with a smile.
"Good morning! The same as yesterday, please."
"Two loaves and an apple cake. Seven coins, as always."
"Here you are. See you tomorrow."
"See you tomorrow, and have a good day."

Questions and answers for practice:
What is 3 + 4? The answer is 7.
What is 9 + 6? The answer is 15.
What is 14 + 28? The answer is 42.
What is 25 + 25? The answer is 50.
What is 18 - 9? The answer is 9.
What is 7 * 6? The answer is 42.
How many legs does a cat have? A cat has 4 legs.
How many wheels does a bicycle have? A bicycle has 2 wheels.
Which is larger, 38 or 83? The number 83 is larger than 38.
Which is smaller, 71 or 17? The number 17 is smaller than 71.
Is 91 higher or lower than 19? It is higher.
Is 12 higher or lower than 21? It is lower.

A short list of things to remember before a long walk: water, bread, cheese, an apple, a map, a warm
coat and good shoes. Tell someone where you are going and when you will be back. Start early, walk
at a steady pace, rest when you are tired, and turn back if the weather becomes bad. The hills will
still be there another day.

At the end of the week the teacher asked the class what they had learned. "Counting apples," said
one child. "Adding and taking away," said another. "That numbers are everywhere," said the girl who
had answered first at the market. The teacher wrote all of the answers on the board, and then she
added one more line: "Ask good questions, and listen carefully to the answers."
)corpus";

} // namespace

std::string_view builtin_corpus() noexcept {
  return corpus_text;
}

} // namespace rlforge::text
