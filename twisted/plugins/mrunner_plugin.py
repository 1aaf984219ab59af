from twisted.application.service import ServiceMaker

mrunner = ServiceMaker(
    "mrunner", "mrunner.tap", "One OpenAI-compatible endpoint for all your local models.", "mrunner"
)
