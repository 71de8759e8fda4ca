#!/usr/bin/env python3
"""Golden vectors and a schema check for voxgate-realtime, using the reference Python client.

Run by `cargo xtask golden` inside a venv that has `deepslate-core` (whose
`deepslate/core/proto/realtime_pb2.py` is the published protocol) and `grpcio-tools`.

1. Compiles our `proto/realtime.proto` with `grpc_tools.protoc` and compares its descriptor with
   the published one, field by field and enum value by enum value. Any difference is an error:
   the two must be wire-compatible, and matching names keep JSON and text formats compatible too.
2. Builds messages with the published module and writes them with deterministic serialization,
   one `.bin` per message. The Rust tests decode these and re-encode them byte for byte.

Values are chosen so that both sides agree on a single canonical encoding: floats stored in
`float` fields are exactly representable in 32 bits, and no map value is an empty message.
"""

import argparse
import os
import subprocess
import sys
import tempfile

from google.protobuf import descriptor_pb2, struct_pb2, timestamp_pb2

from deepslate.core.proto import realtime_pb2 as pb

FIELD_TYPE_NAMES = {
    value: name
    for name, value in descriptor_pb2.FieldDescriptorProto.Type.items()
}
FIELD_LABEL_NAMES = {
    value: name
    for name, value in descriptor_pb2.FieldDescriptorProto.Label.items()
}


# --------------------------------------------------------------------------------------------
# Descriptor comparison
# --------------------------------------------------------------------------------------------


def compile_ours(proto_path):
    """Compiles our .proto with grpc_tools.protoc and returns its FileDescriptorProto."""
    proto_dir = os.path.dirname(os.path.abspath(proto_path))
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "realtime.pb")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"--proto_path={proto_dir}",
                f"--descriptor_set_out={out}",
                os.path.basename(proto_path),
            ],
            check=True,
        )
        with open(out, "rb") as f:
            fds = descriptor_pb2.FileDescriptorSet.FromString(f.read())
    (ours,) = [f for f in fds.file if f.name == os.path.basename(proto_path)]
    return ours


def describe_field(message, field):
    # `json_name` is left out: protoc strips it from descriptors embedded in _pb2 modules, and it
    # is derived from `name`, which is compared.
    oneof = (
        message.oneof_decl[field.oneof_index].name
        if field.HasField("oneof_index")
        else None
    )
    return {
        "number": field.number,
        "type": FIELD_TYPE_NAMES[field.type],
        "label": FIELD_LABEL_NAMES[field.label],
        "type_name": field.type_name,
        "oneof_index": field.oneof_index if field.HasField("oneof_index") else None,
        "oneof": oneof,
        "proto3_optional": field.proto3_optional,
    }


def flatten_messages(prefix, messages, into):
    for message in messages:
        name = f"{prefix}{message.name}"
        into[name] = message
        flatten_messages(f"{name}.", message.nested_type, into)


def flatten_enums(prefix, messages, enums, into):
    for enum in enums:
        into[f"{prefix}{enum.name}"] = enum
    for message in messages:
        name = f"{prefix}{message.name}"
        flatten_enums(f"{name}.", message.nested_type, message.enum_type, into)


def compare_descriptors(ours, published):
    """Returns a list of human-readable differences (empty when the schemas match)."""
    diffs = []

    def check(what, mine, theirs):
        if mine != theirs:
            diffs.append(f"{what}: ours {mine!r}, published {theirs!r}")

    check("package", ours.package, published.package)
    check("syntax", ours.syntax, published.syntax)
    check("imports", sorted(ours.dependency), sorted(published.dependency))

    our_msgs, their_msgs = {}, {}
    flatten_messages("", ours.message_type, our_msgs)
    flatten_messages("", published.message_type, their_msgs)
    for name in sorted(set(our_msgs) - set(their_msgs)):
        diffs.append(f"message {name}: only in ours")
    for name in sorted(set(their_msgs) - set(our_msgs)):
        diffs.append(f"message {name}: missing from ours")
    for name in sorted(set(our_msgs) & set(their_msgs)):
        mine, theirs = our_msgs[name], their_msgs[name]
        check(f"message {name}: map_entry", mine.options.map_entry, theirs.options.map_entry)
        check(
            f"message {name}: oneofs",
            [o.name for o in mine.oneof_decl],
            [o.name for o in theirs.oneof_decl],
        )
        my_fields = {f.name: f for f in mine.field}
        their_fields = {f.name: f for f in theirs.field}
        for fname in sorted(set(my_fields) - set(their_fields)):
            diffs.append(f"message {name}: field {fname}: only in ours")
        for fname in sorted(set(their_fields) - set(my_fields)):
            diffs.append(f"message {name}: field {fname}: missing from ours")
        for fname in sorted(set(my_fields) & set(their_fields)):
            a = describe_field(mine, my_fields[fname])
            b = describe_field(theirs, their_fields[fname])
            for key in a:
                check(f"message {name}: field {fname}: {key}", a[key], b[key])

    our_enums, their_enums = {}, {}
    flatten_enums("", ours.message_type, ours.enum_type, our_enums)
    flatten_enums("", published.message_type, published.enum_type, their_enums)
    for name in sorted(set(our_enums) - set(their_enums)):
        diffs.append(f"enum {name}: only in ours")
    for name in sorted(set(their_enums) - set(our_enums)):
        diffs.append(f"enum {name}: missing from ours")
    for name in sorted(set(our_enums) & set(their_enums)):
        check(
            f"enum {name}: values",
            [(v.name, v.number) for v in our_enums[name].value],
            [(v.name, v.number) for v in their_enums[name].value],
        )
    return diffs


# --------------------------------------------------------------------------------------------
# Golden vectors
# --------------------------------------------------------------------------------------------


def pcm(length, seed):
    """Deterministic, non-repeating-looking audio bytes."""
    return bytes((i * 31 + seed * 17 + (i >> 3)) & 0xFF for i in range(length))


def value(python_value):
    v = struct_pb2.Value()
    if python_value is None:
        v.null_value = struct_pb2.NULL_VALUE
    elif isinstance(python_value, bool):
        v.bool_value = python_value
    elif isinstance(python_value, (int, float)):
        v.number_value = float(python_value)
    elif isinstance(python_value, str):
        v.string_value = python_value
    elif isinstance(python_value, list):
        v.list_value.values.extend(value(x) for x in python_value)
    elif isinstance(python_value, dict):
        v.struct_value.CopyFrom(struct(python_value))
    else:
        raise TypeError(python_value)
    return v


def struct(mapping):
    s = struct_pb2.Struct()
    s.update(mapping)
    return s


def duration(seconds, nanos):
    return pb.Duration(seconds=seconds, nanos=nanos)


def audio_line(rate, channels, fmt):
    return pb.AudioLineConfiguration(sample_rate=rate, channel_count=channels, sample_format=fmt)


WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "location": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "country": {"type": "string", "minLength": 2, "maxLength": 2},
            },
            "required": ["city"],
        },
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "hourly": {"type": "boolean"},
        "note": {"type": ["string", "null"], "default": None},
    },
    "required": ["location"],
    "additionalProperties": False,
}


def service(**payload):
    return pb.ServiceBoundMessage(**payload)


def client(**payload):
    return pb.ClientBoundMessage(**payload)


def initialize_full():
    request = pb.InitializeSessionRequest(
        input_audio_line=audio_line(16000, 1, pb.SIGNED_16_BIT),
        output_audio_line=audio_line(24000, 2, pb.FLOAT_32_BIT),
        vad_configuration=pb.VadConfiguration(
            confidence_threshold=0.625,
            min_volume=0.125,
            start_duration=duration(0, 150_000_000),
            stop_duration=duration(0, 390_000_000),
            backbuffer_duration=duration(1, 500),
        ),
        inference_configuration=pb.InferenceConfiguration(
            system_prompt="You are a helpful assistant. Antworte auf Deutsch, bitte. \u2764",
            temperature=0.3,
        ),
        tts_configuration=pb.TtsConfiguration(
            eleven_labs=pb.ElevenLabsTtsConfiguration(
                api_key="sk_test_0123456789abcdef",
                voice_id="21m00Tcm4TlvDq8ikWAM",
                model_id="eleven_turbo_v2",
                voice_settings=pb.ElevenLabsVoiceSettings(
                    stability=0.5,
                    similarity_boost=0.75,
                    style=0.1,
                    use_speaker_boost=True,
                    speed=1.1,
                ),
                location=pb.EU,
            )
        ),
        supports_playback_reporting=True,
        enable_vad_frame_telemetry=True,
    )
    request.experiments["flag"].bool_value = True
    request.experiments["ratio"].number_value = 0.75
    request.experiments["name"].string_value = "beta"
    request.experiments["nothing"].null_value = struct_pb2.NULL_VALUE
    request.experiments["list"].CopyFrom(value([1, "two", False, None]))
    request.experiments["nested"].CopyFrom(value({"a": {"b": 3, "c": [0.5]}}))
    return service(initialize_session_request=request)


def initialize_hosted_clone():
    return service(
        initialize_session_request=pb.InitializeSessionRequest(
            input_audio_line=audio_line(48000, 2, pb.SIGNED_32_BIT),
            output_audio_line=audio_line(22050, 1, pb.FLOAT_64_BIT),
            vad_configuration=pb.VadConfiguration(
                confidence_threshold=0.5,
                start_duration=duration(0, 200_000_000),
                stop_duration=duration(2, 0),
                backbuffer_duration=duration(1, 0),
            ),
            inference_configuration=pb.InferenceConfiguration(
                system_prompt="Clone test", temperature=1.25
            ),
            tts_configuration=pb.TtsConfiguration(
                hosted=pb.HostedTtsConfiguration(
                    voice_clone_v1=pb.HostedVoiceCloneV1(
                        audio_data=pcm(960, 3),
                        audio_format=audio_line(16000, 1, pb.SIGNED_16_BIT),
                        ref_text="The quick brown fox jumps over the lazy dog.",
                    ),
                    mode=pb.LOW_LATENCY,
                )
            ),
        )
    )


def initialize_hosted_ref():
    # What the reference client sends for a text-only session with a hosted voice.
    return service(
        initialize_session_request=pb.InitializeSessionRequest(
            input_audio_line=audio_line(24000, 1, pb.SIGNED_16_BIT),
            output_audio_line=audio_line(24000, 1, pb.SIGNED_16_BIT),
            vad_configuration=pb.VadConfiguration(
                confidence_threshold=0.4,
                start_duration=duration(0, 150_000_000),
                stop_duration=duration(0, 390_000_000),
                backbuffer_duration=duration(1, 0),
            ),
            inference_configuration=pb.InferenceConfiguration(
                system_prompt="You are a helpful assistant.", temperature=0.3
            ),
            tts_configuration=pb.TtsConfiguration(
                hosted=pb.HostedTtsConfiguration(
                    voice_ref=pb.HostedVoiceRef(voice_id="nova"),
                    mode=pb.HIGH_QUALITY,
                )
            ),
        )
    )


def tool_call_request():
    return pb.ToolCallRequest(
        id="call_7",
        name="get_weather",
        parameters=struct(
            {"location": {"city": "Berlin", "country": "DE"}, "days": 3, "hourly": False}
        ),
        turn_id=4,
    )


def chat_history():
    tts_audio = pb.ChatAudioData(
        audio=pb.AudioData(data=pcm(320, 5)),
        format=audio_line(24000, 1, pb.SIGNED_16_BIT),
        transcription="Hello! How can I help?",
    )
    system = pb.ChatMessage(
        role=pb.SYSTEM,
        content=[pb.ChatMessageContent(text_content=pb.ChatTextContent(text="Be brief."))],
        delivery_status=pb.DELIVERY_COMPLETE,
        created_at=timestamp_pb2.Timestamp(seconds=1_767_225_600, nanos=0),
    )
    user = pb.ChatMessage(
        role=pb.USER,
        content=[
            pb.ChatMessageContent(
                input_audio=pb.ChatAudioData(
                    audio=pb.AudioData(data=pcm(640, 1)),
                    format=audio_line(16000, 1, pb.SIGNED_16_BIT),
                    transcription="What's the weather in Berlin?",
                )
            )
        ],
        delivery_status=pb.DELIVERY_COMPLETE,
        created_at=timestamp_pb2.Timestamp(seconds=1_767_225_601, nanos=250_000_000),
        turn_id=1,
    )
    assistant = pb.ChatMessage(
        role=pb.ASSISTANT,
        content=[
            pb.ChatMessageContent(thoughts="The user wants the forecast; call the tool."),
            pb.ChatMessageContent(tool_call=tool_call_request()),
            pb.ChatMessageContent(
                tool_result=pb.ToolCallResponse(id="call_7", result='{"temp_c": 21}')
            ),
            pb.ChatMessageContent(text_content=pb.ChatTextContent(text="Hello! How can I help?", tts_audio=tts_audio)),
            pb.ChatMessageContent(instructions="Greet the user."),
        ],
        delivery_status=pb.DELIVERY_INTERRUPTED,
        created_at=timestamp_pb2.Timestamp(seconds=1_767_225_602, nanos=999_999_999),
        turn_id=2,
        truncated_at_response_turn_id=5,
    )
    ephemeral = pb.ChatMessage(
        role=pb.ASSISTANT,
        content=[pb.ChatMessageContent(text_content=pb.ChatTextContent(text="One moment."))],
        delivery_status=pb.DELIVERY_IN_PROGRESS,
        ephemeral=True,
        created_at=timestamp_pb2.Timestamp(seconds=1_767_225_603, nanos=1),
        turn_id=3,
    )
    return pb.ChatHistory(messages=[system, user, assistant, ephemeral])


def vectors():
    """Every golden vector, by file stem. Service-bound names start with `service_`."""
    yield "service_initialize_full", initialize_full()
    yield "service_initialize_hosted_clone", initialize_hosted_clone()
    yield "service_initialize_hosted_ref", initialize_hosted_ref()
    yield "service_reconfigure", service(
        reconfigure_session_request=pb.ReconfigureSessionRequest(
            input_audio_line=audio_line(8000, 1, pb.UNSIGNED_8_BIT),
            inference_configuration=pb.InferenceConfiguration(
                system_prompt="Speak like a pirate.", temperature=0.9
            ),
        )
    )
    yield "service_reconfigure_empty", service(
        reconfigure_session_request=pb.ReconfigureSessionRequest()
    )
    yield "service_user_input_audio", service(
        user_input=pb.UserInput(
            packet_id=42, mode=pb.IMMEDIATE, audio_data=pb.AudioData(data=pcm(640, 0))
        )
    )
    yield "service_user_input_text", service(
        user_input=pb.UserInput(
            packet_id=43, mode=pb.QUEUE, text_data=pb.TextData(data="Wie spät ist es? \U0001f570")
        )
    )
    yield "service_update_tools", service(
        update_tool_definitions_request=pb.UpdateToolDefinitionsRequest(
            tool_definitions=[
                pb.ToolDefinition(
                    name="get_weather",
                    description="Weather forecast for a location",
                    parameters=struct(WEATHER_SCHEMA),
                ),
                pb.ToolDefinition(
                    name="hang_up",
                    parameters=struct({"type": "object", "properties": {}}),
                ),
            ]
        )
    )
    yield "service_tool_call_response", service(
        tool_call_response=pb.ToolCallResponse(id="call_7", result='{"temp_c": 21}')
    )
    yield "service_trigger_inference", service(
        trigger_inference=pb.TriggerInference(
            extra_instructions="Greet the user by name.", flush_vad=True
        )
    )
    yield "service_export_chat_history", service(
        export_chat_history_request=pb.ExportChatHistoryRequest(
            await_pending=True, exclude_audio=True
        )
    )
    yield "service_playback_report", service(
        playback_position_report=pb.PlaybackPositionReport(bytes_played=96_000, turn_id=2)
    )
    yield "service_direct_speech", service(
        direct_speech=pb.DirectSpeech(
            text="Please hold.", include_in_history=False, uninterruptable=True
        )
    )
    yield "service_conversation_query", service(
        conversation_query=pb.ConversationQuery(
            prompt="You summarise calls.", instructions="Summarise in one sentence."
        )
    )
    yield "service_ping", service(ping=pb.Ping())

    yield "client_tool_call_request", client(tool_call_request=tool_call_request())
    yield "client_model_text_fragment", client(
        model_text_fragment=pb.ModelTextFragment(text="Hello", turn_id=2)
    )
    yield "client_model_audio_chunk", client(
        model_audio_chunk=pb.ModelAudioChunk(audio=pb.AudioData(data=pcm(480, 2)), turn_id=2)
    )
    yield "client_playback_clear_buffer", client(playback_clear_buffer=pb.PlaybackClearBuffer())
    yield "client_response_begin", client(response_begin=pb.ResponseBegin(turn_id=2))
    yield "client_response_end", client(response_end=pb.ResponseEnd(turn_id=2))
    yield "client_chat_history", client(chat_history=chat_history())
    yield "client_error", client(
        error=pb.SessionErrorNotification(
            category=pb.ERROR_CONFIGURATION,
            message="input_audio_line.sample_rate: 0 is outside 8000..=192000",
            trace_id="trace-0001",
        )
    )
    yield "client_user_transcription_result", client(
        user_transcription_result=pb.UserTranscriptionResult(
            turn_id=1, text="What's the weather in Berlin?", language="en"
        )
    )
    yield "client_conversation_query_result", client(
        conversation_query_result=pb.ConversationQueryResult(text="The user asked about weather.")
    )
    yield "client_session_ready", client(session_ready=pb.SessionReady())
    yield "client_vad_analysis_frame", client(
        vad_analysis_frame=pb.VadAnalysisFrame(
            frame_index=1234,
            session_time=duration(19, 744_000_000),
            confidence=0.875,
            volume=0.25,
            state=pb.SPEECH_ENDING,
            source_packet_ids=[41, 42],
        )
    )
    yield "client_vad_state_event", client(
        vad_state_event=pb.VadStateEvent(
            session_time=duration(20, 16_000_000),
            from_state=pb.SPEECH_STARTING,
            to_state=pb.SPEECH,
            packet_id=42,
        )
    )
    yield "client_context_truncated", client(
        context_truncated=pb.ContextTruncated(truncated_turn_ids=[1, 2, 3], response_turn_id=9)
    )
    yield "client_pong", client(pong=pb.Pong())
    yield "client_model_speech_progress", client(
        model_speech_progress=pb.ModelSpeechProgress(
            turn_id=2, text="Hello! How", audio_bytes_played=19_200, exact=True
        )
    )
    yield "client_turn_snapshot", client(
        turn_snapshot=pb.TurnSnapshot(message=chat_history().messages[2], is_final=True)
    )
    yield "client_inference_complete", client(inference_complete=pb.InferenceComplete(turn_id=2))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--proto", required=True, help="our realtime.proto")
    parser.add_argument("--out", required=True, help="directory for the .bin files")
    args = parser.parse_args()

    published = descriptor_pb2.FileDescriptorProto.FromString(pb.DESCRIPTOR.serialized_pb)
    diffs = compare_descriptors(compile_ours(args.proto), published)
    if diffs:
        print(f"{args.proto} differs from the published protocol:", file=sys.stderr)
        for line in diffs:
            print(f"  {line}", file=sys.stderr)
        sys.exit(1)
    print(f"{args.proto} matches the published descriptor", file=sys.stderr)

    os.makedirs(args.out, exist_ok=True)
    count = 0
    for stem, message in vectors():
        data = message.SerializeToString(deterministic=True)
        # Parsing back through the published module catches a vector we built wrongly.
        type(message).FromString(data)
        with open(os.path.join(args.out, f"{stem}.bin"), "wb") as f:
            f.write(data)
        count += 1
    print(f"wrote {count} vectors to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
