"""The hand-labelled table of realistic generated user turns that the rule-based classifier is
tested on (tests/test_rules.py) and the held-out rule set is measured on (tests/test_train.py).

Every expectation follows docs/labels.md. ``None`` means the rules must stay undecided (the
case is ambiguous, or beyond what rules can judge) and leave it to the LLM judge.
"""

from __future__ import annotations

from typing import NamedTuple

from userturn.records import Case

CHATML = "<|im_start|>assistant"

# ---- realistic queries and assistant answers ----------------------------------------------------
Q_JANET = (
    "Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes "
    "muffins for her friends every day with four. She sells the remainder at the farmers' market "
    "daily for $2 per fresh duck egg. How much in dollars does she make every day at the farmers' "
    "market?")
A_JANET = (
    "Janet's ducks lay 16 eggs per day. She eats 3 eggs for breakfast and uses 4 eggs for muffins, "
    "so she uses 3 + 4 = 7 eggs.\nThe remaining eggs are 16 - 7 = 9 eggs.\nShe sells each egg for "
    "$2, so she makes 9 * 2 = $18 every day.\n#### 18")
Q_CLIPS = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in "
    "May. How many clips did Natalia sell altogether in April and May?")
A_CLIPS = (
    "In May, Natalia sold 48 / 2 = 24 clips.\nAltogether she sold 48 + 24 = 72 clips in April and "
    "May.\n#### 72")
A_CLIPS_LOOP = "In May she sold 24 clips. " * 12
Q_WENG = (
    "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
    "How much did she earn?")
A_WENG = (
    "Weng earns 12 / 60 = $0.2 per minute.\nWorking 50 minutes, she earned 0.2 x 50 = $10.\n"
    "#### 10")
Q_LETTERS = (
    "James writes a 3-page letter to 2 different friends twice a week. How many pages does he "
    "write a year?")
A_LETTERS = (
    "He writes each friend 3 * 2 = 6 pages a week.\nSo he writes 6 * 2 = 12 pages every week.\n"
    "That means he writes 12 * 52 = 624 pages a year.\n#### 624")
A_LETTERS_CUT = (  # cut off by max_tokens
    "He writes each friend 3 * 2 = 6 pages a week.\nSo he writes 6 * 2 = 12 pages every week.\n"
    "That means over a whole year he writes")
Q_HAIKU = "Write a haiku about autumn leaves. Do not use any commas."
A_HAIKU = "Crimson leaves drifting\nWhispering to the cold ground\nSummer says goodbye"
Q_FACT = "Write a Python function that returns the factorial of n."
A_FACT = (
    "Here is an iterative version:\n\n```python\ndef factorial(n):\n    result = 1\n    for i in "
    "range(2, n + 1):\n        result *= i\n    return result\n```\n\nWould you like to see a "
    "recursive version as well?")
Q_JAPAN = "I'm planning a trip to Japan in April. Any tips?"
A_JAPAN = (
    "April is cherry blossom season, so book hotels early, especially in Kyoto. Get a Japan Rail "
    "Pass if you plan to travel between cities, carry some cash because many small shops don't "
    "take cards, and visit Ueno Park or Hirosaki Castle for hanami.")
Q_ES = "Juan tiene 5 manzanas y compra 3 más. ¿Cuántas manzanas tiene ahora?"
A_ES = "Juan tenía 5 manzanas y compró 3 más: 5 + 3 = 8. Ahora tiene 8 manzanas."
Q_ZH = "小明有5个苹果，又买了3个。他现在有几个苹果？"
A_ZH = "小明原来有5个苹果，又买了3个，所以一共有5 + 3 = 8个苹果。"

# ---- real conversations: SmolLM2-135M-Instruct on GSM-Symbolic (greedy, T=1.0), answers cut ----
_UNITS = " Give the result as your final answer. Do not include units."
Q_PEBBLES = (
    "Robert has a bag of pebbles with 72 inside. He tripped over rock while carrying it and "
    "dropped 36 of them. He scrambled to search for them but only came up with 17. When he went "
    "back home, he inspected the pebbles further. 9 of them he picked up wasn't a pebbles, but "
    "actually coins so he got rid of it. How many pebbles did Robert end up with?" + _UNITS)
A_PEBBLES = (
    "Robert has a bag of pebbles with 72 inside. He tripped over rock while carrying it and "
    "dropped 36 of them. He scrambled to search for them but only came up with 17. So, he ended "
    "up with 17 - 36 = 9 pebbles.")
Q_BLOCKS = (
    "A building is made out of 4 orange blocks, 2 times as many green blocks, and an unknown "
    "number of white blocks. If there are 31 blocks in the building in total, how many white "
    "blocks are there?" + _UNITS)
A_BLOCKS = ("1. 4 orange blocks\n2. 2 times as many green blocks\n3. 2 times as many white blocks\n"
            "4. 31\n\nThe answer is 31.")
Q_TOYS = ("A boy has 9 toys. His cousin has 3 fewer toys than he has. How many toys do they have "
          "together?" + _UNITS)
A_TOYS = (
    "A boy has 9 toys. His cousin has 3 fewer toys than he has. So, 9 - 3 = 5 toys.\nThe total "
    "number of toys is 9 + 5 = 14 toys.\nThe total number of toys is 9 + 14 = 21 toys.\nThe "
    "answer is 21.")
Q_SKEINS = (
    "Martha is knitting winter wear for her 2 grandchildren. They're twins, so they're all the "
    "same size. She wants to make a shawl, hat, tunic, socks, and gloves for each of them. It "
    "takes 9 skeins of wool to make a shawl, 4 for a hat, 8 for a tunic, 16 for a pair of socks, "
    "and 15 for a pair of gloves. How many skeins of wool will she need to buy?" + _UNITS)
A_SKEINS = (
    "To solve this problem, we need to find the total number of skews of wool needed to make a "
    "shawl, hat, and gloves.\n\nThe total number of skews of wool is 9 * 4 = 36.\n\nNow, we can "
    "multiply this by the number of skews of wool per shawl, hat, or glove, which is 36 * 4 = 144."
    "\n\nSo, Martha needs to buy 144 skews of wool to make a shawl, hat, or glove.\n\nThe answer "
    "is 144.")
Q_AMELIA = (
    "Amelia is learning to write and decides to keep re-writing the farsi alphabet (with 32 "
    "letters) until she knows it. She writes it in full 3, writes 0.5 of it once, then re-writes "
    "everything she has already written. How many letters has Amelia written in total?" + _UNITS)
A_AMELIA = (
    "Amelia is writing 3 letters (A) and 0.5 letters (A) in total.\n\nTo find the total number of "
    "letters Amelia wrote, you can multiply the number of letters by the number of letters she "
    "wrote: 3 * 0.5 = 1.\n\nSo, Amelia wrote 1.\n\nThe result is 1.")
Q_FLOWERS = (
    "Olivia has a flower bed that is 112.5 feet long. Olivia wants to fill her flower bed with "
    "plants. Each plant, including the space it needs around it, requires 1.25 feet of space. "
    "Olivia already owns 17 flowers. Each flowering plant costs €3 at the store, how much money "
    "will Olivia spend at the store to fill up her flower bed?" + _UNITS)
A_FLOWERS = (
    "To find out how much money Olivia will spend at the store, we need to calculate the cost of "
    "each plant.\n\nEach plant costs 1.25€. So, 1.25€ / 2.000€ = 1.25€\n\nSo, Olivia will spend "
    "1.25€ / 1.25 = 1.25€\n\nSo, the answer is 1.25€.")
Q_QUIZ = (
    "In a 100-item quiz, 20% of the questions are chemistry, and the rest are equally divided as "
    "literature and biology questions. If Mia is sure to get 5% of the chemistry questions, and "
    "half of the literature and biology questions correctly, how many points is she sure to get?"
    + _UNITS)
A_QUIZ = "100 * 100 = 10000 points\nMia is sure to get 10000 points\n\nThe answer is: 10000"
Q_SILAGE = (
    "Robert is feeding his livestock silage. Each llama needs 5 kilograms, and each alpaca needs 9 "
    "kilograms less than twice the amount each llama needs. If there are 27 llamas and 17 alpacas, "
    "how many kilograms of silage does Robert need?" + _UNITS)
A_SILAGE = (  # loops until max_tokens
    "We can do this by multiplying 5 by 100, which is 100, and then multiplying 27 by 100, which "
    "is 200.\n\nSo, 100 x 200 = 20000 kilograms of silage is needed.\n\n" * 2
    + "We can do this by multiplying")
Q_TAX = (
    "Olivia is trying to decide whether to do her financial planning herself or hire an tax "
    "consultant. If she does it herself, she'll be able to do 4 fewer hours of consulting work, "
    "losing €67/hour in missed income. The tax consultant charges €173. How much more money will "
    "she have if she hires the tax consultant?" + _UNITS)
A_TAX = (
    "Cost of hiring the tax consultant = 4 * 173 = €67.\nCost of doing financial planning herself "
    "= 1 * 173 = €22.\nTotal cost of doing financial planning herself = 173 + 22 = €33.\n\nThe "
    "answer is: 33")
Q_BUTTONS = (
    "William has a bag of buttons with 94 inside. He tripped over stick while carrying it and "
    "dropped 47 of them. He scrambled to search for them but only came up with 12. When he went "
    "back home, he inspected the buttons further. 4 of them he picked up wasn't a buttons, but "
    "actually beads so he got rid of it. How many buttons did William end up with?" + _UNITS)
A_BUTTONS = (
    "There are 94 buttons in total.\nWilliam tripped over stick while carrying it and dropped 47 "
    "of them.\nSo, 94 - 47 = 18 buttons were dropped.\nWilliam ended up with 18 buttons.\n#### 18")
Q_INSECTS = (
    "Dax went to their backyard to pick some blueberries and found half as many grasshoppers as "
    "beetles in the plot. If there were 188 beetles, calculate the total number of insects in the "
    "plot." + _UNITS)
A_INSECTS = (
    "The total number of insects in the plot is 188 beetles * 2 = 360 grasshoppers.\nThe answer is "
    "360 / 2 = 180.\n#### 180")
Q_FORKS = (
    "Isabella was preparing for a game night at her house, where she intended to serve creme "
    "brulee. Later, her husband also bought a package of 19 new forks and gave them to Isabella. "
    "While Isabella was making the creme brulee, she used 6 of the forks to sample her creme "
    "brulee. Later, when she went to set the table, she had a total of 39 forks. How many forks "
    "were in the package that Isabella bought?" + _UNITS)
A_FORKS = (
    "We know that Isabella bought 39 forks, and she used 6 of them to sample her creme brulee. "
    "Total number of forks Isabella bought = Number of forks Isabella used + Number of forks she "
    "used\n= 39 + 6\n= 45\n\nSo, Isabella bought 45 forks.")
Q_HOUSE = (
    "Ms. Johnson is looking for a apartment that will not go beyond her $410,000 budget. She saw a "
    "property that has a selling price of $400,000. On top of that, the buyer has to pay a "
    "brokerage fee which is 8% of the selling price, and also the transfer fee that is 14% of the "
    "selling price. How much more is the total price of the apartment than Ms. Johnson's budget?"
    + _UNITS)
A_HOUSE_CUT = (
    "First, we calculate the total cost:\n\nTotal cost = Selling price + Transfer fee + Transfer "
    "fee * 1.11 = $400,000 + $8.00 * 1.11 = $400,000 + $8.00 = $480,000\n\nNow, we calculate the "
    "selling price:\n\nSelling price = $400,000 * 1.11 = $480,000\n\nThe total cost is:")
Q_HUNT = (
    "Oliver hid 7 dozen eggs in the yard for the Easter egg hunt. William finds 13 eggs. Lucas "
    "finds 2 times as many as William. Ava finds 2 less than Lucas, and Isabella finds 0.5 as many "
    "as Ava. How many eggs are still hidden in the yard?" + _UNITS)
A_HUNT_LOOP = "1. 7 dozen eggs\n2. 13 eggs\n3. 2 times 13 eggs\n" + "".join(
    f"{i}. 20 eggs\n" for i in range(4, 12)) + "12. 20"
Q_PAINT = (
    "John has 12 tubes of orange paint and 9 tubes of yellow paint. Ben has half as many tubes of "
    "orange paint as John, and three times as many tubes of yellow paint as John. How many tubes "
    "of paint does Ben have?" + _UNITS)
A_PAINT = "12 + 9 = 21\nThe answer is 21."
Q_GRAPE = (
    "I have 10 liters of grape drink that are 0.6666666666666666 water and I wish to add it to 20 "
    "liters of mango drink that is 0.5 water. But as I pour it, I spill 4 liter of the grape "
    "drink. How much water is in the remaining 26 liters?" + _UNITS)
A_GRAPE = (
    "Now, we can multiply this decimal by 2 to find the total amount of water that is left.\n\n"
    "So, 0.66666666666667 * 2 = 1.222222222222222...\n\nThis is the amount of water that is left "
    "after the grape drink is poured into the mango drink.\n\nThe answer is 1.222222222222222...")
Q_BREAD = (
    "According to its nutritional info, a bag of breads has 175 calories per serving. If a 20 "
    "grams bag has 5 servings, how many grams can you eat if your daily calorie target is 1800 and "
    "you have already consumed 1450 calories?" + _UNITS)
A_BREAD = (
    "1. 175 calories = 175 * 100 = 1750 calories\n2. 1450 calories = 1450 * 100 = 14500 calories\n"
    "3. 1450 calories = 14500 * 100 = 145000 calories\n4. 14500 calories = 145000 * 100 = 1450000")
Q_TICKETS = (
    "Oakwood High School is holding graduation in their Auditorium this year which has space for "
    "11950 people. After accounting for 1300 seats for graduates and 250 seats for faculty "
    "attending, how many tickets would each graduate receive to give to their friends and family "
    "if the tickets are split equally?" + _UNITS)
A_TICKETS = (
    "11950 (total) + 250 (fees) = 3650\n11950 (total) / 1300 = 0.0333\n11950 (total) / 250 = "
    "0.0033\n\nThe answer is 0.0033.")
# ---- short queries and factual answers: turns that repeat the query, or go on from the answer ----
Q_TIMES, A_TIMES = "What is 12 * 7?", "12 * 7 = 84."
Q_CAPITAL, A_CAPITAL = "What is the capital of France?", "The capital of France is Paris."
Q_CAPITAL_FR, A_CAPITAL_FR = ("Quelle est la capitale de la France ?",
                              "La capitale de la France est Paris.")
Q_CAPITAL_ES, A_CAPITAL_ES = "¿Cuál es la capital de Francia?", "La capital de Francia es París."
Q_CAPITAL_DE, A_CAPITAL_DE = ("Was ist die Hauptstadt von Frankreich?",
                              "Die Hauptstadt von Frankreich ist Paris.")
Q_AUSTEN = "Who wrote Pride and Prejudice?"
A_AUSTEN = "Pride and Prejudice was written by Jane Austen and published in 1813."
Q_MONA, A_MONA = ("Who painted the Mona Lisa?",
                  "It was painted by Leonardo da Vinci in the early 1500s.")
Q_ROOT, A_ROOT = "What is the square root of 1764?", "The square root of 1764 is 42."
Q_PRIME, A_PRIME = "Is 221 a prime number?", "221 is not prime. It factors as 13 x 17 = 221."
Q_GCD = ("Find the Greatest Common Divisor (GCD) of these numbers: 982, 908. Give only the GCD "
         "as your final answer.")
A_GCD = "Both are even and share no other factor, so the GCD is 2."
Q_EXPAND, A_EXPAND = "Expand (x + 3)(x - 5).", "(x + 3)(x - 5) = x^2 - 5x + 3x - 15 = x^2 - 2x - 15"
Q_SOLVE, A_SOLVE = "Solve for u: 42*u + 127 = 3991", "42*u = 3864, so u = 92."
BAT_BALL = (
    "A bat and a ball together cost $1.10. The bat costs $1.00 more than the ball. How much does "
    "the ball cost?")


class C(NamedTuple):
    """One case: a name, the conversation, the generated user turn and the expected label."""

    name: str
    query: str
    answer: str
    turn: str
    expected: str | None
    raw: str = ""  # the turn with its special tokens; defaults to the turn itself


CASES = [
    # ---- empty -----------------------------------------------------------------------------------
    C("empty-string", Q_JANET, A_JANET, "", "empty"),
    C("whitespace", Q_CLIPS, A_CLIPS, "  \n\t ", "empty"),
    C("only-im-end", Q_CLIPS, A_CLIPS, "", "empty", raw="<|im_end|>"),
    C("empty-think-block", Q_WENG, A_WENG, "<think>\n\n</think>", "empty",
      raw="<think>\n\n</think><|im_end|>"),
    C("only-eot-id", Q_LETTERS, A_LETTERS, "", "empty", raw="<|eot_id|>"),
    C("deepseek-header-only", Q_CLIPS, A_CLIPS, "", "empty", raw="<｜Assistant｜>"),
    C("dots", Q_CLIPS, A_CLIPS, "......", "empty"),
    C("only-question-mark", Q_WENG, A_WENG, "?", "empty"),
    C("stray-char", Q_JANET, A_JANET, "x", "empty"),
    C("the-the-the", Q_CLIPS, A_CLIPS, "the the the the the the the the", "empty"),
    C("same-line-loop", Q_JAPAN, A_JAPAN, "I love it.\n" * 8, "empty"),
    C("char-loop", Q_HAIKU, A_HAIKU, "hahahahahahahahahahaha", "empty"),
    # labels.md: degenerate repetition that copies the assistant's looping text is empty
    C("copies-assistant-loop", Q_CLIPS, A_CLIPS_LOOP, "In May she sold 24 clips. " * 9, "empty"),
    # ---- assistant_drift -------------------------------------------------------------------------
    C("header-then-text", Q_CLIPS, A_CLIPS, "", "assistant_drift",
      raw="<|im_start|>assistant\nSure! The total is 72 clips."),
    C("gemma-model-header", Q_CLIPS, A_CLIPS, "", "assistant_drift",
      raw="<start_of_turn>model\nNatalia sold 72 clips in total.<end_of_turn>"),
    C("assistant-role-prefix", Q_CLIPS, A_CLIPS, "Assistant: Natalia sold 72 clips altogether.",
      "assistant_drift"),
    C("stripped-header-word", Q_WENG, A_WENG, "assistant\nWeng earned $10 for 50 minutes.",
      "assistant_drift"),
    C("sure-heres", Q_LETTERS, A_LETTERS,
      "Sure! Here's a step-by-step solution: James writes 3 pages to each of 2 friends.",
      "assistant_drift"),
    C("lets-solve", Q_CLIPS, A_CLIPS,
      "Let's solve this step by step. In April Natalia sold 48 clips. In May she sold half as "
      "many.",
      "assistant_drift"),
    C("to-find", Q_JANET, A_JANET,
      "To find out how much Janet makes, we first subtract the eggs she eats and bakes with.",
      "assistant_drift"),
    C("re-solves-gsm8k", Q_JANET, A_JANET,
      "Janet has 16 - 3 - 4 = 9 eggs left. She makes 9 * 2 = $18 a day.\n#### 18",
      "assistant_drift"),
    # labels.md: a coherent copy or continuation of the assistant's solution is assistant_drift
    C("coherent-copy-of-solution", Q_JANET, A_JANET,
      "She eats 3 eggs for breakfast and uses 4 eggs for muffins, so she uses 3 + 4 = 7 eggs. The "
      "remaining eggs are 16 - 7 = 9 eggs.", "assistant_drift"),
    C("copy-of-chitchat-answer", Q_JAPAN, A_JAPAN,
      "Get a Japan Rail Pass if you plan to travel between cities, carry some cash because many "
      "small shops don't take cards.", "assistant_drift"),
    C("hope-this-helps", Q_WENG, A_WENG,
      "I hope this helps! Let me know if you have any other questions.", "assistant_drift"),
    C("youre-welcome", Q_JAPAN, A_JAPAN,
      "You're welcome! If you have any more questions about your trip, feel free to ask.",
      "assistant_drift"),
    C("restate-then-solve", Q_LETTERS, A_LETTERS,
      "James writes a 3-page letter to 2 different friends twice a week. So each week he writes "
      "3 * 2 * 2 = 12 pages. In a year he writes 12 * 52 = 624 pages. The answer is 624.",
      "assistant_drift"),
    C("boxed", Q_WENG, A_WENG, "She earns 12/60 per minute, so 50 minutes give $\\boxed{10}$.",
      "assistant_drift"),
    C("spanish-drift", Q_CLIPS, A_CLIPS,
      "¡Claro! Aquí está la solución: 48 / 2 = 24 y 48 + 24 = 72.\n#### 72", "assistant_drift"),
    # labels.md: starts as the user, but most of the text is the assistant answering
    C("mostly-assistant-after-user-opening", Q_CLIPS, A_CLIPS,
      "Why did you divide by 2? In May she sold 48 / 2 = 24 clips, and in total she sold "
      "48 + 24 = 72 clips in April and May.", "assistant_drift"),
    # ---- meta ------------------------------------------------------------------------------------
    C("user-is-asking", Q_CLIPS, A_CLIPS,
      "The user is asking how many clips Natalia sold in April and May combined.", "meta"),
    C("user-wants", Q_JANET, A_JANET,
      "The user wants to know how much Janet earns each day at the farmers' market.", "meta"),
    C("in-this-conversation", Q_WENG, A_WENG,
      "In this conversation, the assistant correctly calculated Weng's earnings.", "meta"),
    C("possible-user-response", Q_CLIPS, A_CLIPS,
      'Here is a possible user response: "Thanks, that makes sense!"', "meta"),
    C("as-the-user", Q_CLIPS, A_CLIPS,
      "As the user, I would ask why the assistant divided 48 by 2.", "meta"),
    C("user-response-label", Q_CLIPS, A_CLIPS,
      "User response: Can you explain why you divided by 2?", "meta"),
    C("possible-follow-up", Q_CLIPS, A_CLIPS,
      "Possible follow-up: What if Natalia sold twice as many clips in May?", "meta"),
    C("system-prompt", Q_LETTERS, A_LETTERS,
      "You are a helpful assistant. Answer the user's math questions step by step.", "meta"),
    C("reasoning-how-to-respond", Q_WENG, A_WENG,
      "Okay, so the user asked about babysitting pay and got $10. I need to write a follow-up as "
      "the user.", "meta"),
    C("assistants-answer", Q_WENG, A_WENG,
      "The assistant's answer is correct: 50 minutes at $12 an hour is $10.", "meta"),
    # ---- restatement -----------------------------------------------------------------------------
    C("exact-copy", Q_CLIPS, A_CLIPS, Q_CLIPS, "restatement"),
    C("paraphrase-janet", Q_JANET, A_JANET,
      "Janet's ducks lay 16 eggs a day. She eats 3 for breakfast and uses 4 to bake muffins for "
      "her friends. She sells the rest at the farmers' market for $2 each. How much money does "
      "she make every day?", "restatement"),
    C("changed-numbers", Q_WENG, A_WENG,
      "Weng earns $15 an hour for babysitting. Yesterday she did 40 minutes of babysitting. How "
      "much did she earn?", "restatement"),
    C("instruction-again", Q_HAIKU, A_HAIKU,
      "Write a haiku about autumn leaves without using any commas.", "restatement"),
    C("chitchat-again", Q_JAPAN, A_JAPAN,
      "I'm planning a trip to Japan in April, do you have any tips?", "restatement"),
    C("smollm-restates", Q_LETTERS, A_LETTERS,
      "James writes a 3-page letter to 2 different friends twice a week. How many pages does "
      "James write in a year?", "restatement"),
    C("code-task-again", Q_FACT, A_FACT,
      "Write a Python function to return the factorial of n.", "restatement"),
    C("spanish-restates", Q_ES, A_ES, Q_ES, "restatement"),
    # ---- generic ---------------------------------------------------------------------------------
    C("thanks", Q_CLIPS, A_CLIPS, "Thanks!", "generic", raw="Thanks!<|im_end|>"),
    C("thank-you-for-help", Q_JANET, A_JANET, "Great, thank you for the help.", "generic"),
    C("ok", Q_WENG, A_WENG, "Ok.", "generic"),
    C("explain-more", Q_LETTERS, A_LETTERS, "Can you explain more?", "generic"),
    C("got-it", Q_JAPAN, A_JAPAN, "Got it, thanks a lot!", "generic"),
    C("makes-sense", Q_CLIPS, A_CLIPS, "Thank you so much, that makes sense now.", "generic"),
    C("wow-helpful", Q_HAIKU, A_HAIKU, "Wow, that's really helpful. Thanks!", "generic"),
    C("spanish-thanks", Q_ES, A_ES, "¡Muchas gracias!", "generic"),
    C("chinese-thanks", Q_ZH, A_ZH, "谢谢！", "generic"),
    C("thanks-after-offer", Q_FACT, A_FACT, "Thanks! That was helpful.", "generic"),
    # ---- follow_up -------------------------------------------------------------------------------
    # labels.md: gratitude plus a grounded question is follow_up
    C("thanks-but-why-72", Q_CLIPS, A_CLIPS, "Thanks! But why 72?", "follow_up"),
    C("why-divide", Q_CLIPS, A_CLIPS, "Why did you divide 48 by 2?", "follow_up"),
    C("dispute-total", Q_JANET, A_JANET,
      "Your total is 18 but I think it should be 20 because she also sells the muffins.",
      "follow_up"),
    # labels.md: after a cut-off answer, asking for the missing part is follow_up
    C("cut-off-finish", Q_LETTERS, A_LETTERS_CUT, "It stopped mid-sentence, can you finish?",
      "follow_up"),
    C("cut-off-next-step", Q_LETTERS, A_LETTERS_CUT, "Please continue with the next step.",
      "follow_up"),
    C("yes-recursive", Q_FACT, A_FACT, "Yes, please show the recursive version.", "follow_up"),
    C("how-did-you-get", Q_WENG, A_WENG, "How did you get 0.2 per minute?", "follow_up"),
    C("where-second-2", Q_LETTERS, A_LETTERS,
      "In the second step you multiplied 6 by 2. Where does that 2 come from?", "follow_up"),
    C("rail-pass", Q_JAPAN, A_JAPAN,
      "Is the Japan Rail Pass worth it if I'm only visiting Tokyo and Kyoto?", "follow_up"),
    C("haiku-line", Q_HAIKU, A_HAIKU,
      "Why did you end with 'Summer says goodbye' when the poem is about autumn?", "follow_up"),
    # labels.md: non-English text follows the same rules
    C("spanish-why-8", Q_ES, A_ES, "¿Por qué el resultado es 8?", "follow_up"),
    C("chinese-why-8", Q_ZH, A_ZH, "为什么是8个？", "follow_up"),
    C("german-why-divide", Q_CLIPS, A_CLIPS, "Danke! Warum hast du durch 2 geteilt?", "follow_up"),
    # ---- new_query -------------------------------------------------------------------------------
    C("capital-of-france", Q_CLIPS, A_CLIPS, "What is the capital of France?", "new_query"),
    C("new-word-problem", Q_CLIPS, A_CLIPS,
      "A baker makes 45 loaves of bread each morning and sells 38 of them. How many loaves are "
      "left at the end of the day?", "new_query"),
    C("poem-about-sea", Q_CLIPS, A_CLIPS, "Write a poem about the sea.", "new_query"),
    C("flat-tire", Q_JANET, A_JANET, "How do I change a flat tire on my bike?", "new_query"),
    C("marbles", Q_WENG, A_WENG,
      "Tom has 7 red marbles and 14 blue marbles. He gives 5 to his sister. How many marbles does "
      "he have now?", "new_query"),
    C("book-recommendation", Q_JAPAN, A_JAPAN,  # "book" (hotels) is a homonym, not shared content
      "Can you recommend a good book about World War II?", "new_query"),
    C("translate", Q_HAIKU, A_HAIKU, "Translate 'good morning' into German.", "new_query"),
    C("sum-of-two-numbers", Q_LETTERS, A_LETTERS, "What is the sum of 125 and 378?", "new_query"),
    C("spanish-new-question", Q_ES, A_ES, "¿Cuál es la capital de Francia?", "new_query"),
    C("new-question-on-topic", Q_JANET, A_JANET,  # labels.md: a new task on the same topic
      "Is selling eggs at a farmers market a profitable small business idea?", "new_query"),
    # ---- undecided: ambiguous, or beyond what rules can judge ------------------------------------
    C("explain-second-step", Q_CLIPS, A_CLIPS, "Can you explain the second step?", None),
    C("what-if-variation", Q_CLIPS, A_CLIPS,
      "What if Natalia sold twice as many clips in May instead?", None),
    C("user-summarises", Q_CLIPS, A_CLIPS,
      "Thanks, that makes sense. So in May she sold 24 clips.", None),
    C("role-labelled-script", Q_CLIPS, A_CLIPS, "User: Why did you divide by 2?", None),
    C("emoji-only", Q_JAPAN, A_JAPAN, "👍", None),
    C("yes-to-offer", Q_FACT, A_FACT, "Yes.", None),  # may answer the assistant's question
    C("word-salad", Q_CLIPS, A_CLIPS,  # empty per labels.md, but rules cannot tell it from prose
      "Purple elephants negotiate quietly beneath the recursive staircase of Tuesday.", None),
    C("same-for-five", Q_LETTERS, A_LETTERS, "Can you do the same for 5 friends?", None),
    C("this-function-after-offer", Q_FACT, A_FACT,
      "What is the time complexity of this function?", None),
    C("restatement-plus-short-answer", Q_JANET, A_JANET,
      "Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes "
      "muffins for her friends every day with four. How much does she make? #### 18", None),
    C("continue-after-complete-answer", Q_CLIPS, A_CLIPS, "Please continue.", None),
    C("question-then-degenerates", Q_CLIPS, A_CLIPS,
      "What is the capital of France? " + "France " * 30, None),
    C("request-then-copies-loop", Q_CLIPS, A_CLIPS_LOOP,
      "Make it shorter.\n" + "In May she sold 24 clips. " * 8, None),
    C("echoes-result-number", Q_CLIPS, A_CLIPS, "72", None),
    C("states-another-number", Q_CLIPS, A_CLIPS, "The answer is 80.", None),  # a dispute, or drift
    C("states-answer-after-question", Q_CLIPS, A_CLIPS + "\nShall I check it another way?",
      "The answer is 72.", None),  # may answer the assistant's question
    C("states-answer-asking", Q_CLIPS, A_CLIPS, "The answer is 72?", None),
    # labels.md: answering the problem is assistant_drift; the assistant's own final answer stated
    # again as "The answer is N." is that (as "So the answer is 72." always was); "not N" disputes
    # it. Any other N (a dispute or a new solution) and a reply to a question stay undecided.
    C("states-the-answer", Q_CLIPS, A_CLIPS, "The answer is 72.", "assistant_drift"),
    C("answer-is-not", Q_CLIPS, A_CLIPS, "The answer isn't 72!", "follow_up"),
    # ---- real turns from a SmolLM2-135M-Instruct run on GSM-Symbolic (some shortened) ----------
    C("smol-bat-ball-after-pebbles", Q_PEBBLES, A_PEBBLES, BAT_BALL, "new_query"),
    # "$1.00" is "1", as is the answer's list marker "1.": a shared digit tells nothing
    C("smol-bat-ball-after-numbered-list", Q_BLOCKS, A_BLOCKS, BAT_BALL, "new_query"),
    C("smol-bat-ball-after-loop", Q_HUNT, A_HUNT_LOOP, BAT_BALL, "new_query"),
    C("smol-bat-ball-shares-together", Q_TOYS, A_TOYS, BAT_BALL, "new_query"),
    C("smol-classic-puzzle-wrapper", Q_TAX, A_TAX,
      "What is the answer to this classic lateral thinking puzzle: A bat and a ball together cost "
      "$1.10. The bat and the ball are out of a box. What is the price of the ball?", "new_query"),
    C("smol-classic-math-problem", Q_BUTTONS, A_BUTTONS,
      "What is the answer to this classic math problem: 100 + 100 + 100 + 100 = ?", "new_query"),
    C("smol-dice-shares-a-5", Q_QUIZ, A_QUIZ,
      "What is the probability of getting a 5 when rolling a fair six-sided die?", "new_query"),
    C("smol-snail-puzzle", Q_INSECTS, A_INSECTS,  # its "2 feet" is no question about the answer's 2
      "A snail is at the bottom of a 20-foot well. Each day, it climbs up 3 feet, but at night, it "
      "slips back 2 feet. How many days will it take for the snail to reach the top of the well?",
      "new_query"),
    C("smol-rewrite-task", Q_PEBBLES, A_PEBBLES,
      "Rewrite the sentence so that every single word is different, in other words. A fairy told "
      "him to eat all branches on the tree. Answer his request as appropriately altered sentence.",
      "new_query"),
    C("smol-new-problem-shares-12", Q_PAINT, A_PAINT,
      "12 balls sold last month will leave 202 balls empty after sale. Chocolate sellers at "
      "auction will only sell 1 box of chocolate per month. How many days would it take to "
      "transport the last box of chocolate by car?", "new_query"),
    C("smol-new-question-on-topic", Q_FORKS, A_FORKS,
      "What are the nicknames Alexandra used before, and Isabella before.", "new_query"),
    C("smol-answer-to-the-question", Q_SKEINS, A_SKEINS,
      "What is the answer to the question: How many skews of wool will Martha need to buy to make "
      "a shawl, hat, and glove?", "restatement"),
    C("smol-asks-the-question-again", Q_AMELIA, A_AMELIA,
      "How many letters does Amelia write in total?", "restatement"),
    C("smol-asks-the-question-clause-again", Q_FLOWERS, A_FLOWERS,
      "What is the answer to the question: How much does Olivia spend at the store to fill up her "
      "flower bed?", "restatement"),
    C("smol-states-final-answer", Q_PEBBLES, A_PEBBLES, "The answer is 9", "assistant_drift"),
    C("smol-states-looping-result", Q_SILAGE, A_SILAGE, "The answer is 20000.", "assistant_drift"),
    C("smol-answer-is-not", Q_FLOWERS, A_FLOWERS, "The answer is not 1.25.", "follow_up"),
    C("smol-this-180", Q_INSECTS, A_INSECTS,
      "What does this 180 represent considering addition of the rules of proportions.",
      "follow_up"),
    C("smol-does-that-mean", Q_FORKS, A_FORKS,
      "Does that mean Isabella ate a few 6 of those 19 forks also?", "follow_up"),
    C("smol-role-prompt", Q_BREAD, A_BREAD,
      "You are the newest new expert in adventure. You have carried out daring expedition.",
      "meta"),
    C("smol-story-then-loop", Q_FORKS, A_FORKS,
      "Isabella was planning to eat a cake that was made with 200 grams of chocolate. She had 200 "
      "grams of chocolate and she had 200 grams of chocolate." + " She had 200 chocolate chips." * 6
      + " She", "empty"),
    # new questions on the query's topic with numbers or quantities of their own: new_query by
    # labels.md, but too close to a variation or an extension of the answer for the rules
    C("smol-topic-question-with-numbers", Q_HOUSE, A_HOUSE_CUT,
      "How much will Ms. Johnson pay in full purchase during that 18 month period at 3.9% per "
      "purchase?", None),
    C("smol-topic-question-small-numbers", Q_HUNT, A_HUNT_LOOP,
      "Can Lena only gather 1 egg every 5 minutes?", None),
    C("was-that-a-trick", Q_CLIPS, A_CLIPS, "Was that a trick question?", None),  # "that" points
    C("topic-extension", Q_CLIPS, A_CLIPS,
      "How much money did Natalia make if each clip cost 2 dollars?", None),
    C("smol-question-with-answer-numbers", Q_INSECTS, A_INSECTS,  # restatement or follow_up
      "What is the answer to the question: What is the total number of insects in the plot if "
      "there were 180 grasshoppers and 360 beetles?", None),
    C("smol-garbled-with-answer-number", Q_GRAPE, A_GRAPE,
      "How many liters of grape drink are left after 26 liters of mango drink is poured into the "
      "1.222222222222222...", None),
    C("smol-aside-to-the-assistant", Q_HOUSE, A_HOUSE_CUT,
      "What is the next building price after $410,000 after removing the $410,000?\nAren't you "
      "just going to skip that 29 stores?", None),
    C("smol-variation-without-question", Q_TAX, A_TAX,
      "Olivia is considering using the tax booth of $2 to reduce her tax from €50 to €30 with the "
      "new tax breaks and without having to pay the full penalty of €20. Her new tax break is "
      "€2.80 off.\n\n3. She can exclude these amounts being completely spent from her new budget.",
      None),
    C("smol-partial-paraphrase", Q_TICKETS, A_TICKETS,
      "What is the total number of tickets that Oakwood High School will receive to give to their "
      "friends and family?", None),
    C("smol-garbled-mixing-question", Q_BLOCKS, A_BLOCKS,
      "What is the total number of balls, how many can each be mixed with the remaining 6 to "
      "guarantee all those will be colored. That sounds easy so I have no idea where to start.",
      None),
    C("smol-word-salad", Q_QUIZ, A_QUIZ,  # empty per labels.md, beyond the rules
      "Walking Library has built one of her favorite robot Cam301 in a promeber to her friend. The "
      "Rosa Mandalena incorporating Carmine-Home made a front escalope and trimmed never to "
      "something to make it not Speakable.", None),
]

# labels.md, label by label and rule by rule, where the table above had no case: short queries,
# and turns that go on from the answer (issue #39). Kept apart from CASES, which is also the table
# tests/test_train.py measures the held-out rule set on (its figures are stated for CASES).
SPEC_CASES = [
    # restatement "repeats ... the ORIGINAL QUERY": word for word whatever its length (a short query
    # has too few content words for the paraphrase rule), with or without its format instruction
    # or end mark, and even where it reads like an assistant ("To solve for u: ...").
    C("short-query-again", Q_TIMES, A_TIMES, Q_TIMES, "restatement"),
    C("short-query-again-unpunctuated", Q_TIMES, A_TIMES, "what is 12 * 7", "restatement"),
    C("short-query-again-contracted", Q_CAPITAL, A_CAPITAL, "What's the capital of France?",
      "restatement"),
    C("query-again-with-format", Q_GCD, A_GCD, Q_GCD, "restatement"),
    C("query-again-plus-please", Q_EXPAND, A_EXPAND, "Expand (x + 3)(x - 5) please.",
      "restatement"),
    C("query-again-as-to-solve", Q_SOLVE, A_SOLVE, "To solve for u: 42*u + 127 = 3991",
      "restatement"),
    C("french-short-query-again", Q_CAPITAL_FR, A_CAPITAL_FR, Q_CAPITAL_FR, "restatement"),
    # ... but other numbers or operators make another question, and two words of a short query
    # may be a new one ("Is 221 even?"): the rules leave these
    C("short-query-other-operator", Q_TIMES, A_TIMES, "What is 12 + 7?", None),
    C("short-query-other-number", Q_TIMES, A_TIMES, "What is 12 * 8?", None),
    C("short-query-partly-again", Q_PRIME, A_PRIME, "Is 221 prime?", None),
    C("short-query-solved", Q_TIMES, A_TIMES, "12 * 7 = 84.", "assistant_drift"),  # re-solves it
    # follow_up "must refer to something that is in the answer": a question that goes on from it
    # (an anaphor, an elliptical "And ...", a name or number only the answer has) shares no
    # words with it, so "no shared words" no longer makes it new_query. Whether "there" is the
    # answer's Paris or the query's France, the rules cannot tell: the classifier decides.
    C("and-live-there", Q_CAPITAL, A_CAPITAL, "And how many people live there?", None),
    C("where-was-she-born", Q_AUSTEN, A_AUSTEN, "Where was she born and where did she grow up?",
      None),
    C("so-which-city", Q_JAPAN, A_JAPAN, "So which city should I stay in?", None),
    C("but-weather-there", Q_JAPAN, A_JAPAN, "But what's the weather like there?", None),
    C("name-only-the-answer-has", Q_MONA, A_MONA,
      "Which museums in Europe show works by Leonardo?", None),
    C("number-only-the-answer-has", Q_ROOT, A_ROOT,
      "How would I check 42 by hand, without a calculator? I tried 40 and 45 first.", None),
    C("french-and-there", Q_CAPITAL_FR, A_CAPITAL_FR, "Et combien d'habitants y vivent ?", None),
    C("spanish-and-there", Q_CAPITAL_ES, A_CAPITAL_ES, "¿Y cuántas personas viven allí?", None),
    C("german-and-there", Q_CAPITAL_DE, A_CAPITAL_DE, "Und wie viele Menschen leben dort?", None),
    C("new-question-on-the-topic", Q_CAPITAL, A_CAPITAL, "What is the capital of Germany?", None),
    # ... while a new problem that names its own people before "he" or "his" stays new_query
    C("new-problem-names-him-first", Q_CLIPS, A_CLIPS,
      "Tom has 5 apples. He eats 2 of them. How many does he have left?", "new_query"),
    C("new-problem-a-boy-his", Q_CLIPS, A_CLIPS,
      "A boy gives his sister 3 of his 8 marbles. How many does he keep?", "new_query"),
    # the schematic follow_up examples, gratitude + a grounded question, a cut-off answer, a reply
    C("your-total-is-72", Q_CLIPS, A_CLIPS, "Your total is 72 but I think it should be 84.",
      "follow_up"),
    C("multiply-by-3-second-step", Q_LETTERS, A_LETTERS,  # the answer never says "multiply"
      "Why did you multiply by 3 in the second step?", None),
    C("thanks-but-why-84", Q_TIMES, A_TIMES, "Thanks! But why is it 84 and not 74?", "follow_up"),
    C("thank-you-why-divide", Q_CLIPS, A_CLIPS, "Thank you! Why did you divide 48 by 2 for May?",
      "follow_up"),
    C("cut-off-whats-next", Q_LETTERS, A_LETTERS_CUT, "What's the next step?", "follow_up"),
    C("cut-off-finish-sentence", Q_LETTERS, A_LETTERS_CUT, "Can you finish the last sentence?",
      "follow_up"),
    C("sure-recursive", Q_FACT, A_FACT, "Sure, show me the recursive one.", "follow_up"),
    C("reply-without-reply-word", Q_FACT, A_FACT, "The recursive one, please.", None),
    # generic, meta and assistant_drift after a short query: the short-query rule takes none
    C("thanks-after-short-query", Q_CAPITAL, A_CAPITAL, "Thanks!", "generic"),
    C("user-is-asking-population", Q_CAPITAL, A_CAPITAL,
      "The user is asking for the population of Paris.", "meta"),
    C("certainly-recursive", Q_FACT, A_FACT, "Certainly! Here is the recursive version:",
      "assistant_drift"),
    C("lets-solve-short-query", Q_TIMES, A_TIMES, "Let's solve this step by step: 12 * 7 = 84.",
      "assistant_drift"),
    C("short-query-looping", Q_CAPITAL, A_CAPITAL, (Q_CAPITAL + " ") * 4, "empty"),
]


def as_case(c: C, header: str = CHATML) -> Case:
    """The case as the classifier sees it."""
    return Case(c.query, c.answer, c.turn, c.raw or c.turn, header)
