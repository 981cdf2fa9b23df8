"""English words of the cross-family pair's task (study/build_french_words.py, study/cross_family_probe.py).

FRENCH: held-out words with one usual French translation (accents as graded: `contains` ignores them).
TRAIN_WORDS: training words (no translations needed: the teacher scores the student's answers); disjoint from
FRENCH and from the teacher's two-shot examples ("dog", "house").
"""

# Common English words with one usual French translation (graded ignoring accents and case).
FRENCH = {"cat": "chat", "water": "eau", "bread": "pain", "apple": "pomme", "book": "livre", "tree": "arbre",
          "car": "voiture", "sun": "soleil", "moon": "lune", "sea": "mer", "fire": "feu", "school": "ecole",
          "city": "ville", "night": "nuit", "red": "rouge", "green": "vert", "black": "noir", "white": "blanc",
          "milk": "lait", "cheese": "fromage", "horse": "cheval", "bird": "oiseau", "fish": "poisson",
          "flower": "fleur", "door": "porte", "window": "fenetre", "chair": "chaise", "hand": "main", "head": "tete",
          "heart": "coeur", "woman": "femme", "man": "homme", "child": "enfant", "king": "roi", "queen": "reine",
          "mother": "mere", "father": "pere", "brother": "frere", "sister": "soeur", "morning": "matin",
          "summer": "ete", "winter": "hiver", "snow": "neige", "rain": "pluie", "wind": "vent", "mountain": "montagne",
          "street": "rue", "church": "eglise", "wine": "vin", "money": "argent"}

TRAIN_WORDS = """
air animal answer arm art autumn baby back ball bank bath bed bee beer bell belt bike blood blue boat body bone
bottle box boy brain bridge brown butter button cake camera candle cap card carpet castle chicken circle clock
cloud coat coffee cold color cook corn country cow cup dance daughter desk dinner doctor dream dress drink duck
ear earth egg eight eye face farm fast field finger floor flour fly food foot forest fork four fox fruit game
garden gate gift girl glass glove goat gold grass gray hair hat hill hole honey hope hospital hot hour ice idea
iron island jacket key kitchen knee knife lake lamp language leaf leg lemon letter life light lion lip love
map market meat milkshake minute mirror month mouse mouth music name neck nose number ocean office oil old
orange page paper park party pen pencil people pig pink plate pocket potato rabbit rice ring road rock roof room
rose salt sand shirt shoe shop silver sky sleep smile soap sock song soup spoon spring star stone sugar table
tea teacher teeth thread tiger toe tomato tongue tooth towel town toy train truck uncle village voice wall
watch week wheel wife wolf wood word world yellow young
""".split()
